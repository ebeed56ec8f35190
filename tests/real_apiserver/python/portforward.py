"""Port-forward to a pod through the apiserver with the official Python client
(`kubernetes.stream.portforward`), the way its documentation shows; prints what came back as
one JSON object for tests/real_apiserver/python_client.rs.

Usage: portforward.py KUBECONFIG NAMESPACE POD WEB_PORT CLOSED_PORT
"""

import hashlib
import json
import os
import sys

from kubernetes import client, config
from kubernetes.stream import portforward

# Every read has a deadline: a client whose proxy thread died on a frame it did not expect
# would otherwise wait forever; the test reports the timeout instead.
TIMEOUT = 30


def exchange(sock, request):
    """Sends `request` on a forwarded port and reads the answer to its end."""
    sock.settimeout(TIMEOUT)
    sock.sendall(request)
    chunks = []
    while True:
        data = sock.recv(1 << 20)
        if not data:
            break
        chunks.append(data)
    sock.close()
    return b"".join(chunks)


def main():
    kubeconfig, namespace, pod, web, closed = sys.argv[1:6]
    web, closed = int(web), int(closed)
    config.load_kube_config(config_file=kubeconfig)
    api = client.CoreV1Api()
    result = {}

    # One connection forwarding two ports: the guest's web server, and a port nothing
    # listens on (its error channel says why).
    pf = portforward(api.connect_get_namespaced_pod_portforward, pod, namespace, ports=f"{web},{closed}")
    reply = exchange(pf.socket(web), b"GET /from-python HTTP/1.1\r\nHost: guest\r\nConnection: close\r\n\r\n")
    result["get"] = reply.decode(errors="replace")
    result["get_error"] = pf.error(web)
    dead = pf.socket(closed)
    dead.settimeout(TIMEOUT)
    result["closed_read"] = dead.recv(1).decode(errors="replace")
    result["closed_error"] = pf.error(closed)
    dead.close()

    # 4 MiB through the guest and back, on a connection of its own.
    body = os.urandom(4 << 20)
    pf = portforward(api.connect_get_namespaced_pod_portforward, pod, namespace, ports=str(web))
    request = b"POST /echo HTTP/1.1\r\nHost: guest\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
    reply = exchange(pf.socket(web), request + body)
    head, _, echoed = reply.partition(b"\r\n\r\n")
    result["echo_status"] = head.split(b"\r\n")[0].decode(errors="replace")
    result["echo_sent_sha256"] = hashlib.sha256(body).hexdigest()
    result["echo_back_sha256"] = hashlib.sha256(echoed).hexdigest()
    result["echo_back_bytes"] = len(echoed)
    result["echo_error"] = pf.error(web)

    print(json.dumps(result))


if __name__ == "__main__":
    main()
