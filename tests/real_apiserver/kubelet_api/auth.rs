//! Who may read the kubelet API: an anonymous caller gets 401, a token without the right 403,
//! and a bad query a clear 4xx.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn anonymous_and_unauthorized_callers_are_refused_and_bad_queries_get_a_clear_4xx() {
    let Some(node) = node_with_pod("refuse").await else {
        return;
    };
    let client = node.direct();
    // The serving certificate verifies against the cluster CA for 127.0.0.1 (reqwest checks).
    let anon = client
        .get(node.url("/stats/summary"))
        .send()
        .await
        .expect("TLS with the cluster-signed certificate");
    assert_eq!(anon.status(), 401);
    for path in ["/healthz", "/pods", "/containerLogs/x/y/z", "/nothing-here"] {
        assert_eq!(client.get(node.url(path)).send().await.unwrap().status(), 401, "{path}");
    }
    let bad = client
        .get(node.url("/pods"))
        .bearer_auth("not-a-token")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 401);

    let nobody = token_with(&node, "nobody", vec![]).await;
    let r = client
        .get(node.url("/stats/summary"))
        .bearer_auth(&nobody)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let body = r.text().await.unwrap();
    assert!(
        body.contains(&format!("user=system:serviceaccount:{}:nobody", node.ns))
            && body.contains("resource=nodes")
            && body.contains("subresource(s)=[stats]"),
        "{body}"
    );

    // nodes/proxy but not nodes/stats: /pods is allowed (its fallback), /stats is not.
    let proxy_only = token_with(
        &node,
        "proxy-only",
        vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["nodes/proxy".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }],
    )
    .await;
    // RBAC reaches the authorizer through an informer: wait for the binding to count.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let pods = loop {
        let r = client
            .get(node.url("/pods"))
            .bearer_auth(&proxy_only)
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            break r.text().await.unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "proxy-only still refused /pods: {}",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let pods: serde_json::Value = serde_json::from_str(&pods).unwrap();
    assert_eq!(pods["kind"], "PodList");
    assert_eq!(pods["items"][0]["metadata"]["name"], "web-0");
    let r = client
        .get(node.url("/stats/summary"))
        .bearer_auth(&proxy_only)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    // Bad queries get a 4xx that says what is wrong (and the daemon goes on serving).
    for (path, status, fragment) in [
        (
            format!("/containerLogs/{}/web-0/agent?tailLines=-1", node.ns),
            400,
            "tailLines",
        ),
        (
            format!("/containerLogs/{}/web-0/agent?limitBytes=0", node.ns),
            400,
            "limitBytes",
        ),
        (
            format!(
                "/containerLogs/{}/web-0/agent?sinceSeconds=5&sinceTime=2026-01-01T00:00:00Z",
                node.ns
            ),
            400,
            "at most one of sinceTime or sinceSeconds",
        ),
        (format!("/containerLogs/{}/nope/agent", node.ns), 404, "does not exist"),
        (
            format!("/containerLogs/{}/web-0/other", node.ns),
            404,
            "containers: agent",
        ),
        ("/no/such/endpoint".to_string(), 404, "not served"),
    ] {
        let (got, body) = node.as_apiserver(&path).await;
        assert_eq!(got, status, "{path}: {body}");
        assert!(body.contains(fragment), "{path}: {body}");
    }
    assert_eq!(node.as_apiserver("/healthz").await, (200, "ok".to_string()));
}
