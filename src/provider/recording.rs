//! The cocoon runtime the provider calls, recording what each call's result says about the
//! node's snapshots and images in [`Known`]: every path of the daemon (creates, hibernates,
//! wakes, deletes, pulls, the reclaimer) keeps the facts current without knowing they are kept.
//! The calls themselves pass through unchanged.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use tokio::io::AsyncRead;

use super::known::Known;
use crate::runtime::{
    CloneSource, CloneSpec, CocoonRuntime, ExecIo, ExecOutput, ExecSpec, ImageRecord, Result, RunSpec, RuntimeError,
    SnapshotRecord, StaleCreateOutcome, VmRecord, WatchItem,
};

pub struct Recording {
    inner: Arc<dyn CocoonRuntime>,
    known: Arc<Known>,
}

impl Recording {
    pub fn new(inner: Arc<dyn CocoonRuntime>, known: Arc<Known>) -> Self {
        Self { inner, known }
    }

    /// A snapshot call on `name` that changes it: made on success; on a failure its state is
    /// whatever cocoon left, so it is asked next time.
    fn made_or_unsure<T>(&self, name: &str, result: &Result<T>) {
        match result {
            Ok(_) => self.known.snapshot_made(name),
            Err(_) => self.known.snapshot_unsure(name),
        }
    }
}

#[async_trait]
impl CocoonRuntime for Recording {
    async fn run(&self, spec: &RunSpec) -> Result<VmRecord> {
        self.inner.run(spec).await
    }

    async fn clone_vm(&self, spec: &CloneSpec) -> Result<VmRecord> {
        let result = self.inner.clone_vm(spec).await;
        if let (Err(_), CloneSource::Snapshot(source)) = (&result, &spec.source) {
            // The source may have gone behind the daemon's back: the next clone asks for it.
            self.known.snapshot_unsure(source);
        }
        result
    }

    async fn inspect(&self, reference: &str) -> Result<VmRecord> {
        self.inner.inspect(reference).await
    }

    async fn list(&self) -> Result<Vec<VmRecord>> {
        self.inner.list().await
    }

    async fn remove(&self, reference: &str) -> Result<()> {
        self.inner.remove(reference).await
    }

    async fn start(&self, reference: &str) -> Result<()> {
        self.inner.start(reference).await
    }

    async fn reconcile_stale_create(&self, reference: &str) -> Result<StaleCreateOutcome> {
        self.inner.reconcile_stale_create(reference).await
    }

    async fn net_resize(&self, reference: &str, nics: u32) -> Result<()> {
        self.inner.net_resize(reference, nics).await
    }

    async fn exec(&self, reference: &str, spec: &ExecSpec, io: ExecIo<'_>) -> Result<()> {
        self.inner.exec(reference, spec, io).await
    }

    async fn exec_capture(&self, reference: &str, spec: &ExecSpec, stdin: Option<&[u8]>) -> Result<ExecOutput> {
        self.inner.exec_capture(reference, spec, stdin).await
    }

    async fn logs(&self, reference: &str, tail: Option<u64>) -> Result<String> {
        self.inner.logs(reference, tail).await
    }

    fn watch_events(&self) -> BoxStream<'static, WatchItem> {
        self.inner.watch_events()
    }

    async fn snapshot_save(&self, name: &str, vm_id: &str) -> Result<()> {
        let result = self.inner.snapshot_save(name, vm_id).await;
        self.made_or_unsure(name, &result);
        result
    }

    async fn snapshot_inspect(&self, name: &str) -> Result<SnapshotRecord> {
        let result = self.inner.snapshot_inspect(name).await;
        match &result {
            Ok(record) if record.name == name => self.known.snapshot_seen(record),
            Ok(_) => {}
            Err(e) if e.is_snapshot_not_found() => self.known.snapshot_gone(name),
            Err(_) => {}
        }
        result
    }

    async fn snapshot_list(&self, vm: Option<&str>) -> Result<Vec<SnapshotRecord>> {
        let start = self.known.list_started();
        let result = self.inner.snapshot_list(vm).await;
        match (&result, vm) {
            (Ok(records), None) => self.known.listed(start, records),
            (Ok(records), Some(_)) => records.iter().for_each(|r| self.known.snapshot_seen(r)),
            (Err(_), _) => {}
        }
        result
    }

    async fn snapshot_remove_if_exists(&self, name: &str) -> Result<()> {
        let result = self.inner.snapshot_remove_if_exists(name).await;
        match &result {
            Ok(()) => self.known.snapshot_gone(name),
            Err(_) => self.known.snapshot_unsure(name),
        }
        result
    }

    async fn snapshot_import(&self, name: &str, tar: &mut (dyn AsyncRead + Unpin + Send)) -> Result<()> {
        let result = self.inner.snapshot_import(name, tar).await;
        self.made_or_unsure(name, &result);
        result
    }

    async fn snapshot_export(&self, name: &str) -> Result<Box<dyn AsyncRead + Send + Unpin>> {
        self.inner.snapshot_export(name).await
    }

    async fn snapshot_export_to_dir(&self, name: &str, dir: &Path) -> Result<()> {
        self.inner.snapshot_export_to_dir(name, dir).await
    }

    async fn image_pull(&self, reference: &str, force: bool) -> Result<()> {
        let result = self.inner.image_pull(reference, force).await;
        if result.is_ok() {
            self.known.image_present(reference);
        }
        result
    }

    async fn image_inspect(&self, reference: &str) -> Result<ImageRecord> {
        let result = self.inner.image_inspect(reference).await;
        match &result {
            Ok(_) => self.known.image_present(reference),
            Err(RuntimeError::ImageNotFound { .. }) => self.known.image_gone(reference),
            Err(_) => {}
        }
        result
    }

    async fn image_import(&self, name: &str, data: &mut (dyn AsyncRead + Unpin + Send)) -> Result<()> {
        let result = self.inner.image_import(name, data).await;
        if result.is_ok() {
            self.known.image_present(name);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::sync::oneshot;

    use super::super::known::SnapshotFact;
    use super::*;

    fn rec(name: &str) -> SnapshotRecord {
        SnapshotRecord {
            name: name.into(),
            id: format!("id-{name}"),
            ..Default::default()
        }
    }

    /// A cocoon whose one `snapshot list` has read the node (`read`) when it is called but
    /// answers only once released: the startup's background list, still running while the
    /// daemon saves a snapshot. Its saves succeed; nothing else is called.
    struct HeldList {
        read: Vec<SnapshotRecord>,
        called: Mutex<Option<oneshot::Sender<()>>>,
        release: Mutex<Option<oneshot::Receiver<()>>>,
    }

    #[async_trait]
    impl CocoonRuntime for HeldList {
        async fn snapshot_list(&self, _vm: Option<&str>) -> Result<Vec<SnapshotRecord>> {
            let release = self.release.lock().unwrap().take().expect("one list");
            let _ = self.called.lock().unwrap().take().expect("one list").send(());
            let _ = release.await;
            Ok(self.read.clone())
        }
        async fn snapshot_save(&self, _name: &str, _vm_id: &str) -> Result<()> {
            Ok(())
        }
        async fn run(&self, _: &RunSpec) -> Result<VmRecord> {
            unreachable!()
        }
        async fn clone_vm(&self, _: &CloneSpec) -> Result<VmRecord> {
            unreachable!()
        }
        async fn inspect(&self, _: &str) -> Result<VmRecord> {
            unreachable!()
        }
        async fn list(&self) -> Result<Vec<VmRecord>> {
            unreachable!()
        }
        async fn remove(&self, _: &str) -> Result<()> {
            unreachable!()
        }
        async fn start(&self, _: &str) -> Result<()> {
            unreachable!()
        }
        async fn reconcile_stale_create(&self, _: &str) -> Result<StaleCreateOutcome> {
            unreachable!()
        }
        async fn net_resize(&self, _: &str, _: u32) -> Result<()> {
            unreachable!()
        }
        async fn exec(&self, _: &str, _: &ExecSpec, _: ExecIo<'_>) -> Result<()> {
            unreachable!()
        }
        async fn logs(&self, _: &str, _: Option<u64>) -> Result<String> {
            unreachable!()
        }
        fn watch_events(&self) -> BoxStream<'static, WatchItem> {
            unreachable!()
        }
        async fn snapshot_inspect(&self, _: &str) -> Result<SnapshotRecord> {
            unreachable!()
        }
        async fn snapshot_remove_if_exists(&self, _: &str) -> Result<()> {
            unreachable!()
        }
        async fn snapshot_import(&self, _: &str, _: &mut (dyn AsyncRead + Unpin + Send)) -> Result<()> {
            unreachable!()
        }
        async fn snapshot_export(&self, _: &str) -> Result<Box<dyn AsyncRead + Send + Unpin>> {
            unreachable!()
        }
        async fn snapshot_export_to_dir(&self, _: &str, _: &Path) -> Result<()> {
            unreachable!()
        }
        async fn image_pull(&self, _: &str, _: bool) -> Result<()> {
            unreachable!()
        }
        async fn image_inspect(&self, _: &str) -> Result<ImageRecord> {
            unreachable!()
        }
        async fn image_import(&self, _: &str, _: &mut (dyn AsyncRead + Unpin + Send)) -> Result<()> {
            unreachable!()
        }
    }

    /// The list read the node before the save; the save's fact is newer and must survive the
    /// list's answer (known absent, a fresh bring-up of the VM would skip dropping a fork
    /// snapshot that exists, and its guest would fork from the previous one).
    #[tokio::test]
    async fn a_snapshot_saved_while_a_full_list_runs_is_not_erased_by_the_list() {
        let known = Arc::new(Known::default());
        let (called_tx, called) = oneshot::channel();
        let (release, release_rx) = oneshot::channel();
        let cocoon = HeldList {
            read: vec![rec("base")],
            called: Mutex::new(Some(called_tx)),
            release: Mutex::new(Some(release_rx)),
        };
        let runtime = Arc::new(Recording::new(Arc::new(cocoon), known.clone()));
        let list = tokio::spawn({
            let runtime = runtime.clone();
            async move { runtime.snapshot_list(None).await }
        });
        called.await.expect("the list was called");
        runtime.snapshot_save("fork-vm-a", "vm-a").await.unwrap();
        assert!(!known.list_landed(), "the list is still running");
        release.send(()).unwrap();
        list.await.unwrap().unwrap();

        assert!(known.list_landed());
        assert_eq!(
            known.snapshot("fork-vm-a"),
            SnapshotFact::Unknown,
            "saved after the list read the node: present, its record asked for, never known absent"
        );
        assert_eq!(known.snapshot("base"), SnapshotFact::Present(Box::new(rec("base"))));
        assert_eq!(
            known.snapshot("other"),
            SnapshotFact::Absent,
            "the list is complete otherwise"
        );
    }
}
