//! macOS guests through cocoon-macos, with the newer cocoon-macos flags (`DECISIONS.md` row 7):
//! managed `os=macos` pods never reach the cocoon paths. What a reader needs: `macos/README.md`.
//!
//! - CreatePod: the image is required; a VM this node already tracks by name is adopted; else
//!   `vm inspect` decides (see [`plan::step`]): a live qemu is adopted, a dead record started,
//!   nothing there is run — after the image is ensured once per image (single flight: inspect,
//!   else pull, re-check). The VNC display is a node-unique port ([`vnc`]) when
//!   `COCOON_MACOS_VNC_PASSWORD` is set (cocoon-macos refuses an unauthenticated display on a
//!   CNI VM; unset ⇒ no VNC). A failed `run` never removes anything (the CLI's run is atomic).
//! - Register: id `qemu-NAME`, `ip` from cocoon-net's lease (an old annotation stays until a
//!   lease appears), `vnc-port`; each written only when it changes. Readiness: a TCP accept on
//!   the probe port, else an `SSH-` banner on `:22` (`probe::macos_target`).
//! - DeletePod: `vm rm NAME` (absent counts as done), the leases released, the VNC port freed;
//!   no snapshot logic. Hibernate is refused (`HibernateUnsupported`).
//! - Restart: macOS VMs are not in `cocoon vm list`; `adopt_at_startup` inspects each macOS
//!   pod's VM and re-registers a live one; a dead one is left to the CreatePod replay.

pub mod plan;
pub mod vnc;

use crate::settings::parser;
use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::Arc;

use futures::stream::{self, StreamExt};
use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use super::failure::Failure;
use super::guest::Finish;
use super::lifecycle::{Intent, LifecycleState};
use crate::kubelet::{EventReason, Next, ProviderError};
use crate::model::annotations as key;
use crate::model::{PodFacts, RuntimeAnnotations, VmSpec, vm_spec};
use crate::policy::contract::bring_up;
use crate::policy::contract::resource_translation::BootPath;
use crate::policy::contract::types::RefusalKind;
use crate::runtime::VmRecord;
use crate::runtime::macos::{MacImage, MacRunSpec, MacVm, Vnc};

/// The first VNC port: display 0.
pub const VNC_BASE_PORT: u16 = 5900;
const DEFAULT_VNC_PORTS: RangeInclusive<u16> = 5900..=5999;

/// The node settings of the macOS path.
#[derive(Clone)]
pub struct MacosSettings {
    /// `COCOON_MACOS_VNC_PASSWORD`: `Ok(None)` = VNC off; `Err` = invalid, and every macOS pod
    /// is refused with that message until the operator fixes it (the other pods run).
    pub vnc_password: Result<Option<String>, plan::BadVncPassword>,
    /// `VK_COCOON_MACOS_VNC_PORTS` (`5900-5999`): the ports handed to macOS guests.
    pub vnc_ports: RangeInclusive<u16>,
}

impl std::fmt::Debug for MacosSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let password = match &self.vnc_password {
            Ok(None) => "unset (VNC off)",
            Ok(Some(_)) => "set",
            Err(_) => "invalid",
        };
        f.debug_struct("MacosSettings")
            .field("vnc_password", &password)
            .field("vnc_ports", &self.vnc_ports)
            .finish()
    }
}

impl Default for MacosSettings {
    fn default() -> Self {
        Self {
            vnc_password: Ok(None),
            vnc_ports: DEFAULT_VNC_PORTS,
        }
    }
}

/// The macOS path's node settings.
#[derive(Clone, clap::Args)]
#[command(next_help_heading = "macOS guests")]
pub struct MacosArgs {
    /// The VNC password handed to cocoon-macos (at most 8 characters, no control characters; unset = no VNC). An invalid one refuses every macOS pod until fixed; the other pods run
    #[arg(
        long = "macos-vnc-password",
        env = "COCOON_MACOS_VNC_PASSWORD",
        value_name = "PASSWORD",
        hide_env_values = true
    )]
    pub vnc_password: Option<String>,
    /// The VNC ports handed to macOS guests, one per guest (A-B inside 5900-5999; VNC port = 5900 + display)
    #[arg(long = "macos-vnc-ports", env = "VK_COCOON_MACOS_VNC_PORTS", value_name = "A-B", default_value = "5900-5999",
          value_parser = parser("VK_COCOON_MACOS_VNC_PORTS", "a port range inside 5900-5999 such as 5900-5999 (VNC port = 5900 + display)", parse_ports))]
    pub vnc_ports: RangeInclusive<u16>,
}

// By hand: the password must never reach a log line or a panic message.
impl std::fmt::Debug for MacosArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MacosArgs")
            .field("vnc_password", &self.vnc_password.as_ref().map(|_| "set"))
            .field("vnc_ports", &self.vnc_ports)
            .finish()
    }
}

impl MacosSettings {
    /// An invalid password is kept as an error (the node still serves its other pods and every
    /// macOS pod is refused naming it).
    pub fn from_args(args: &MacosArgs) -> Self {
        let vnc_password = match args.vnc_password.as_deref() {
            None => Ok(None),
            Some(pw) => plan::check_vnc_password(pw).map(|()| Some(pw.to_string())),
        };
        if let Err(message) = &vnc_password {
            tracing::error!(%message, "macOS guests will be refused until COCOON_MACOS_VNC_PASSWORD is fixed");
        }
        Self {
            vnc_password,
            vnc_ports: args.vnc_ports.clone(),
        }
    }

    /// Reads the variables through `lookup`, with the rules of the environment.
    pub fn from_lookup(lookup: &impl Fn(&str) -> Option<String>) -> Result<Self, crate::settings::SettingsError> {
        Ok(Self::from_args(&crate::settings::parse_lookup::<MacosArgs>(lookup)?))
    }
}

/// A `VK_COCOON_MACOS_VNC_PORTS` that is not a range of VNC ports (the setting's parser says
/// what is accepted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a port range inside 5900-5999")]
pub struct NotAVncPortRange;

/// `A-B` (or one port), inside 5900–5999: the port is 5900 + the display number.
fn parse_ports(text: &str) -> Result<RangeInclusive<u16>, NotAVncPortRange> {
    let (a, b) = text.trim().split_once('-').unwrap_or((text.trim(), text.trim()));
    let a: u16 = a.trim().parse().map_err(|_| NotAVncPortRange)?;
    let b: u16 = b.trim().parse().map_err(|_| NotAVncPortRange)?;
    if a > b || !DEFAULT_VNC_PORTS.contains(&a) || !DEFAULT_VNC_PORTS.contains(&b) {
        return Err(NotAVncPortRange);
    }
    Ok(a..=b)
}

fn needs_operator(reason: EventReason, message: String) -> Failure {
    Failure {
        reason,
        message,
        kind: RefusalKind::NeedsOperator,
    }
}

/// CreatePod of a managed macOS pod (its incarnation already claimed).
pub(super) async fn create(
    p: &CocoonProvider,
    pod: &Pod,
    pkey: &str,
    spec: &VmSpec,
    facts: PodFacts,
) -> Result<Next, ProviderError> {
    if spec.hibernate {
        let f = Failure::permanent(
            EventReason::HibernateUnsupported,
            format!(
                "macOS guest {} does not support hibernate (cocoon-macos keeps offline disk snapshots only): clear vm.cocoonstack.io/hibernate to boot it",
                spec.vm_name
            ),
        );
        return super::failed_ops::fail_create(p, pkey, pod, false, f).await;
    }
    crate::provider::publish::set_lifecycle(p, pod, pkey, LifecycleState::Creating, "").await;
    let started = std::time::Instant::now();
    let (vm, adopted) = match bring_up(p, pod, spec, facts).await {
        Ok(up) => up,
        Err(f) => return super::failed_ops::fail_create(p, pkey, pod, false, f).await,
    };
    if !adopted {
        p.metrics
            .vm_boot_duration
            .with_label_values(&["run", plan::HYPERVISOR])
            .observe(started.elapsed().as_secs_f64());
    }
    let uid = super::table::uid_of(pod);
    if !p.state.set_vm(pkey, &uid, vm.clone()) {
        tracing::info!(pod = %pkey, "macOS create finished for a superseded incarnation");
        return Ok(Next::Done);
    }
    register(p, pod, pkey, &vm).await;
    tracing::info!(pod = %pkey, vm = %spec.vm_name, id = %vm.id, adopted, vnc_port = ?p.vnc.port_of(&spec.vm_name), "macOS vm up");
    crate::provider::guest::finish_boot(p, pod, pkey, &vm, Finish::ReadyNow, false).await;
    p.metrics
        .lifecycle("create", "ok", if adopted { "adopted" } else { "" });
    Ok(Next::Done)
}

/// CreatePod of a macOS pod the startup reconcile already re-registered: publish again.
pub(super) async fn adopt_tracked(
    p: &CocoonProvider,
    pod: &Arc<Pod>,
    pkey: &str,
    vm: VmRecord,
) -> Result<Next, ProviderError> {
    p.state.refresh(pkey, pod);
    register(p, pod, pkey, &vm).await;
    crate::provider::guest::finish_boot(p, pod, pkey, &vm, Finish::ReadyNow, false).await;
    p.metrics.lifecycle("create", "ok", "adopted");
    Ok(Next::Done)
}

/// `(vm, adopted)`.
async fn bring_up(p: &CocoonProvider, pod: &Pod, spec: &VmSpec, facts: PodFacts) -> Result<(VmRecord, bool), Failure> {
    let name = spec.vm_name.as_str();
    let password = p
        .cfg
        .macos
        .vnc_password
        .clone()
        .map_err(|m| needs_operator(EventReason::MacOsVncPasswordInvalid, format!("vm {name}: {m}")))?;
    // This node already runs a VM of that name (a duplicate pod, or one adopted at restart),
    // else cocoon-macos may hold a record of it (live or stopped).
    let tracked = p.state.vm_by_name(name).filter(plan::is_macos_vm);
    let inspected = match &tracked {
        Some(_) => None,
        None => match p.ports.macos.inspect(name).await {
            Ok(vm) => Some(vm),
            Err(e) if e.is_not_found() => None,
            Err(e) => {
                return Err(Failure::transient(
                    EventReason::MacOsInspectFailed,
                    format!("checking whether macOS vm {name} already exists: {e}"),
                ));
            }
        },
    };
    let exists = tracked.is_some() || inspected.is_some();
    let image = match decide(p, pod, spec, &facts, exists).await? {
        Decided::Adopt => None,
        Decided::Run(image) => Some(image),
    };
    if let Some(vm) = tracked {
        return Ok((vm, true));
    }
    match plan::step(inspected, plan::pid_alive) {
        plan::Step::AdoptLive(vm) => {
            if let Some(d) = vm.vnc_display() {
                p.vnc.adopt(name, VNC_BASE_PORT.saturating_add(d));
            }
            tracing::info!(vm = %name, pid = vm.pid, "adopting a running macOS vm");
            Ok((plan::record(name, &vm), true))
        }
        plan::Step::StartDead(vm) => {
            let vnc = claim_vnc(p, name, password, vm.vnc_display())?;
            tracing::info!(vm = %name, "macOS vm record found with no live qemu; starting it");
            if let Err(e) = p.ports.macos.start(name, &vnc).await {
                p.vnc.release(name);
                return Err(Failure::transient(
                    EventReason::MacOsStartFailed,
                    format!("start macOS vm {name}: {e}"),
                ));
            }
            Ok((reinspect(p, name).await?, false))
        }
        plan::Step::RunNew => {
            let Some(reference) = image else {
                return Err(Failure::transient(
                    EventReason::CreateBringUpFailed,
                    format!(
                        "the bring-up policy adopts macOS vm {name} but none exists here (it may have just been removed); retried"
                    ),
                ));
            };
            let image = ensure_image(p, &reference).await?;
            let ctx = super::bring_up::Ctx {
                pod,
                facts,
                spec: spec.clone(),
            };
            let (_, guest) = super::bring_up::translate(p, &ctx, BootPath::Run, None).await?;
            let sizes = plan::sizes(guest.as_ref(), image.virtual_size);
            let vnc = claim_vnc(p, name, password, None)?;
            let run = MacRunSpec {
                name: name.to_string(),
                image: reference.clone(),
                cpus: sizes.cpus,
                memory_mib: sizes.memory_mib,
                vnc,
                storage_bytes: sizes.storage_bytes,
            };
            tracing::info!(vm = %name, image = %reference, cpus = sizes.cpus, memory_mib = sizes.memory_mib, storage = ?sizes.storage_bytes, vnc = ?run.vnc, "running a macOS vm");
            // A failed run leaves nothing behind (the CLI's run is atomic): never `rm` here,
            // a same-name VM that appeared meanwhile is not ours to remove.
            if let Err(e) = p.ports.macos.run(&run).await {
                p.vnc.release(name);
                return Err(Failure::transient(
                    EventReason::MacOsRunFailed,
                    format!("run macOS vm {name} from image {reference}: {e}"),
                ));
            }
            Ok((reinspect(p, name).await?, false))
        }
    }
}

/// What the bring-up policy chose for a macOS guest.
enum Decided {
    /// Adopt the VM of that name (the host adopts a live one, starts a stopped one).
    Adopt,
    /// Run a new VM from this image.
    Run(String),
}

/// The bring-up policy decides, through the contract unchanged: adopt the VM of
/// that name, run one from an image, or refuse. A plan no cocoon-macos path can carry out (a
/// clone, fork, restore, ... from a policy that does not know macOS guests) is refused with the
/// policy named, never guessed at.
async fn decide(
    p: &CocoonProvider,
    pod: &Pod,
    spec: &VmSpec,
    facts: &PodFacts,
    exists: bool,
) -> Result<Decided, Failure> {
    let name = spec.vm_name.as_str();
    let key = facts.key();
    // A macOS guest cannot be hibernated, and it is never cloned from a snapshot.
    let facts = super::bring_up::bring_up_facts(
        p,
        pod,
        facts,
        spec,
        exists,
        bring_up::HibernateEvidence::NotChecked,
        Vec::new(),
    );
    let decision = super::bring_up::decide(p, facts, &key, "macOS bring-up decision").await?;
    match decision.outcome {
        bring_up::Outcome::Refuse(refusal) => Err(Failure::refused(refusal, decision.message)),
        bring_up::Outcome::Proceed(bring_up::Plan::AdoptExisting(_)) => Ok(Decided::Adopt),
        bring_up::Outcome::Proceed(bring_up::Plan::Run(run)) if exists => Err(Failure::transient(
            EventReason::CreateBringUpFailed,
            format!(
                "the bring-up policy runs macOS vm {name} from {} but a VM of that name exists here: it must adopt it (reason {:?})",
                run.image, decision.reason
            ),
        )),
        bring_up::Outcome::Proceed(bring_up::Plan::Run(run)) => Ok(Decided::Run(run.image)),
        bring_up::Outcome::Proceed(_) => Err(Failure::permanent(
            EventReason::CreateBringUpFailed,
            format!(
                "the bring-up policy chose {:?} for macOS vm {name}: only adopt-existing, run or a refusal apply to cocoon-macos guests (a bring-up policy must handle os=macos)",
                decision.reason
            ),
        )),
    }
}

async fn reinspect(p: &CocoonProvider, name: &str) -> Result<VmRecord, Failure> {
    p.ports
        .macos
        .inspect(name)
        .await
        .map(|vm: MacVm| plan::record(name, &vm))
        .map_err(|e| {
            Failure::transient(
                EventReason::MacOsInspectFailed,
                format!("inspect macOS vm {name} after its launch: {e}"),
            )
        })
}

/// The VNC flags of a launch: none while VNC is off, else the VM's node-unique port.
fn claim_vnc(
    p: &CocoonProvider,
    name: &str,
    password: Option<String>,
    display: Option<u16>,
) -> Result<Option<Vnc>, Failure> {
    let Some(password) = password else { return Ok(None) };
    let preferred = display.map(|d| VNC_BASE_PORT.saturating_add(d));
    let port = p
        .vnc
        .claim(name, preferred)
        .map_err(|e| Failure::transient(EventReason::MacOsVncPortsExhausted, format!("vm {name}: {e}")))?;
    Ok(Some(Vnc {
        display: port - VNC_BASE_PORT,
        password,
    }))
}

/// The image, once per image however many pods want it at once: inspect, else pull and
/// inspect again.
async fn ensure_image(p: &CocoonProvider, image: &str) -> Result<MacImage, Failure> {
    let owned = image.to_string();
    super::ensure::ensure_macos_image(p, image, move |p| {
        Box::pin(async move { image_present(&p, &owned).await })
    })
    .await
}

async fn image_present(p: &CocoonProvider, image: &str) -> Result<MacImage, Failure> {
    match p.ports.macos.image_inspect(image).await {
        Ok(found) => return Ok(found),
        Err(e) if e.is_not_found() => {}
        Err(e) => {
            return Err(Failure::transient(
                EventReason::MacOsImageInspectFailed,
                format!("inspect macOS image {image}: {e}"),
            ));
        }
    }
    tracing::info!(%image, "pulling macOS image");
    p.ports.macos.image_pull(image).await.map_err(|e| {
        Failure::transient(
            EventReason::MacOsImagePullFailed,
            format!("pull macOS image {image}: {e}"),
        )
    })?;
    p.ports.macos.image_inspect(image).await.map_err(|e| {
        Failure::transient(
            EventReason::MacOsImagePullFailed,
            format!("macOS image {image} is still not there after its pull: {e}"),
        )
    })
}

/// Publishes `id`, `ip` (only once a lease exists: at restart the old one stays until then)
/// and `vnc-port` (removed when no longer served), each only when it changed.
async fn register(p: &CocoonProvider, pod: &Pod, pkey: &str, vm: &VmRecord) {
    let current = RuntimeAnnotations::of_pod(pod);
    let ip = p.resolve_ip(vm);
    let mut changes: BTreeMap<String, Option<String>> = BTreeMap::new();
    if current.vm_id != vm.id {
        changes.insert(key::VM_ID.into(), Some(vm.id.clone()));
    }
    if !ip.is_empty() && current.ip != ip {
        changes.insert(key::IP.into(), Some(ip));
    }
    match p.vnc.port_of(vm.name()) {
        Some(port) if current.vnc_port != port.to_string() => {
            changes.insert(key::VNC_PORT.into(), Some(port.to_string()));
        }
        None if !current.vnc_port.is_empty() => {
            changes.insert(key::VNC_PORT.into(), None);
        }
        _ => {}
    }
    crate::provider::publish::write_annotations(p, pod, pkey, &changes).await;
}

/// DeletePod of a managed macOS pod: `vm rm` (absent is done), then the leases and the port.
pub(super) async fn delete(
    p: &CocoonProvider,
    pod: &Pod,
    pkey: &str,
    uid: &str,
    tracked_vm: Option<VmRecord>,
) -> Result<(), ProviderError> {
    let name = vm_spec::of_pod(pod).vm_name;
    // A name the pod does not hold is another pod's VM (or nobody's): never removed here.
    if name.is_empty() || !p.state.holds(pkey, &name) {
        p.state.forget(pkey, uid, "");
        p.notify(pkey);
        return Ok(());
    }
    // The MAC whose lease goes: the tracked VM's, else what the CLI still records.
    let vm = match tracked_vm.or_else(|| p.state.vm_by_name(&name).filter(plan::is_macos_vm)) {
        Some(vm) => Some(vm),
        None => p.ports.macos.inspect(&name).await.ok().map(|m| plan::record(&name, &m)),
    };
    if let Err(e) = p.ports.macos.remove(&name).await {
        return Err(super::failed_ops::kept(
            p,
            pod,
            pkey,
            &plan::vm_id(&name),
            format!("cocoon-macos vm rm {name}: {e}"),
        ));
    }
    if let Some(vm) = &vm {
        p.release_leases(vm).await;
    }
    let port = p.vnc.release(&name);
    p.state.forget(pkey, uid, &name);
    p.state.release_name(pkey, &name);
    p.metrics.lifecycle("delete", "ok", "");
    tracing::info!(pod = %pkey, vm = %name, vnc_port = ?port, "macOS vm deleted");
    p.notify(pkey);
    Ok(())
}

/// UpdatePod of a managed macOS pod: the only transition asked of vk-cocoon is hibernate, and
/// cocoon-macos has none (offline disk snapshots only): refused, the guest keeps running.
pub(super) async fn update(p: &CocoonProvider, pod: &Pod, pkey: &str, spec: &VmSpec) -> Result<Next, ProviderError> {
    if !spec.hibernate {
        p.metrics.lifecycle("update", "skipped", "noop");
        return Ok(Next::Done);
    }
    let message = format!(
        "macOS guest {} does not support hibernate (cocoon-macos keeps offline disk snapshots only); the guest keeps running, but its lifecycle is failed and the pod Not Ready until it is recreated: clear vm.cocoonstack.io/hibernate",
        spec.vm_name
    );
    crate::provider::publish::fail_op(p, pod, pkey, EventReason::HibernateUnsupported, "update", &message).await;
    p.notify(pkey);
    Err(ProviderError::NeedsOperator {
        reason: EventReason::HibernateUnsupported,
        message,
    })
}

/// Startup: re-register the live macOS VMs of `pods` (they are never in `cocoon vm list`); a
/// dead or missing one is left to the CreatePod replay.
pub(super) async fn adopt_at_startup(p: &CocoonProvider, pods: &[&Arc<Pod>]) {
    stream::iter(pods.iter().copied())
        .for_each_concurrent(8, |pod| async move {
            let spec = vm_spec::of_pod(pod);
            let name = spec.vm_name.clone();
            if name.is_empty() {
                return;
            }
            let pkey = crate::kubelet::pods::pod_key(pod).to_string();
            let uid = super::table::uid_of(pod);
            // Only a name this pod holds, or nobody does (then it takes it), is re-registered.
            if let super::table::NameClaim::Other { holder, .. } = p.state.name_claim(&name, &pkey) {
                tracing::warn!(pod = %pkey, vm = %name, holder = %holder.key(), "not re-registering a macOS vm name another pod holds");
                return;
            }
            if p.state.take_name(&name, &pkey, &uid).is_err() {
                return;
            }
            match p.ports.macos.inspect(&name).await {
                Ok(vm) if vm.pid > 0 && plan::pid_alive(vm.pid) => {
                    p.state.track(&pkey, pod, &name);
                    if let Some(intent) =
                        Intent::from_annotations(&uid, pod.metadata.annotations.as_ref().unwrap_or(&Default::default()))
                    {
                        p.state.seed_intent(&pkey, intent);
                    }
                    if let Some(d) = vm.vnc_display() {
                        p.vnc.adopt(&name, VNC_BASE_PORT.saturating_add(d));
                    }
                    let record = plan::record(&name, &vm);
                    p.state.set_vm(&pkey, &uid, record.clone());
                    register(p, pod, &pkey, &record).await;
                    crate::provider::probe_start::start_probe(p, &pkey, &uid).await;
                    tracing::info!(pod = %pkey, vm = %name, pid = vm.pid, "re-registered a running macOS vm");
                }
                Ok(_) => tracing::info!(pod = %pkey, vm = %name, "macOS vm is not running; CreatePod will start it"),
                Err(e) if e.is_not_found() => {
                    tracing::info!(pod = %pkey, vm = %name, "macOS vm not found; CreatePod will run it")
                }
                Err(error) => {
                    tracing::warn!(pod = %pkey, vm = %name, %error, "inspecting a macOS vm at startup failed; CreatePod will decide")
                }
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn settings_from_the_environment() {
        let d = MacosSettings::from_lookup(&env(&[])).unwrap();
        assert_eq!(d.vnc_password, Ok(None));
        assert_eq!(d.vnc_ports, 5900..=5999);
        let s = MacosSettings::from_lookup(&env(&[
            ("COCOON_MACOS_VNC_PASSWORD", "s3cret"),
            ("VK_COCOON_MACOS_VNC_PORTS", "5910-5919"),
        ]))
        .unwrap();
        assert_eq!(s.vnc_password, Ok(Some("s3cret".into())));
        assert_eq!(s.vnc_ports, 5910..=5919);
        assert!(!format!("{s:?}").contains("s3cret"), "{s:?}");
        let bad = MacosSettings::from_lookup(&env(&[("COCOON_MACOS_VNC_PASSWORD", "123456789")])).unwrap();
        assert!(bad.vnc_password.unwrap_err().to_string().contains("at most 8"));
        for ports in ["5899-5905", "5950-5940", "x", "6000"] {
            let pairs: &'static [(&'static str, &'static str)] =
                Box::leak(vec![("VK_COCOON_MACOS_VNC_PORTS", ports)].into_boxed_slice());
            assert!(MacosSettings::from_lookup(&env(pairs)).is_err(), "{ports}");
        }
        assert_eq!(parse_ports("5905").unwrap(), 5905..=5905);
    }
}
