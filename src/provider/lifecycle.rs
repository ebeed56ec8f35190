//! Lifecycle intent: what vk-cocoon says about a pod in the
//! `vm.cocoonstack.io/lifecycle-*` annotations, and the pure rules deciding whether a new
//! intent replaces the stored one.

use std::collections::BTreeMap;

/// Annotation keys vk writes, and the CocoonSet generation the operator stamps on the pod.
pub use crate::model::annotations::{
    GENERATION, LIFECYCLE_MESSAGE as MESSAGE, LIFECYCLE_OBSERVED_GENERATION as OBSERVED_GENERATION,
    LIFECYCLE_STATE as STATE,
};

/// Longest lifecycle message (bytes).
pub const MAX_MESSAGE: usize = 4096;
/// Longest Event note (bytes).
pub const MAX_EVENT_NOTE: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LifecycleState {
    Creating,
    Ready,
    Hibernating,
    Hibernated,
    Failed,
}

impl LifecycleState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Creating => "creating",
            Self::Ready => "ready",
            Self::Hibernating => "hibernating",
            Self::Hibernated => "hibernated",
            Self::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "creating" => Self::Creating,
            "ready" => Self::Ready,
            "hibernating" => Self::Hibernating,
            "hibernated" => Self::Hibernated,
            "failed" => Self::Failed,
            _ => return None,
        })
    }
}

/// One incarnation's lifecycle intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    pub uid: String,
    pub state: LifecycleState,
    pub generation: i64,
    pub message: String,
}

impl Intent {
    /// The three annotations of the intent; an empty message removes its key.
    pub fn annotations(&self) -> BTreeMap<String, Option<String>> {
        BTreeMap::from([
            (STATE.to_string(), Some(self.state.as_str().to_string())),
            (OBSERVED_GENERATION.to_string(), Some(self.generation.to_string())),
            (
                MESSAGE.to_string(),
                (!self.message.is_empty()).then(|| self.message.clone()),
            ),
        ])
    }

    /// Reads an intent already on a pod (seeded at startup).
    pub fn from_annotations(uid: &str, annotations: &BTreeMap<String, String>) -> Option<Self> {
        let state = LifecycleState::parse(annotations.get(STATE)?)?;
        Some(Intent {
            uid: uid.into(),
            state,
            generation: annotations
                .get(OBSERVED_GENERATION)
                .and_then(|g| g.parse().ok())
                .unwrap_or(0),
            message: annotations.get(MESSAGE).cloned().unwrap_or_default(),
        })
    }
}

/// Why a new intent was not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// Another incarnation of the pod is tracked.
    OtherIncarnation,
    /// The stored intent belongs to another incarnation and the writer's is not tracked.
    Untracked,
    /// Same incarnation, lower generation than the stored intent.
    StaleGeneration,
    /// `failed` at the same generation only yields to failed, creating or hibernating.
    StickyFailed,
}

/// The pod's `generation` annotation (0 when absent or malformed).
pub fn pod_generation(annotations: &BTreeMap<String, String>) -> i64 {
    annotations
        .get(GENERATION)
        .and_then(|g| g.trim().parse().ok())
        .unwrap_or(0)
}

/// Whether `new` replaces `current` (the Go daemon's `applyLifecycle`): an intent of another
/// incarnation, or of an older generation, is dropped, and a `failed` one is replaced at its
/// generation only by `failed`, `creating` or `hibernating`. `tracked_uid` is the incarnation the
/// provider tracks under the pod key, if any.
pub fn admit(current: Option<&Intent>, tracked_uid: Option<&str>, new: &Intent) -> Result<(), Dropped> {
    match tracked_uid {
        Some(t) if t != new.uid => return Err(Dropped::OtherIncarnation),
        None if current.is_some_and(|c| c.uid != new.uid) => return Err(Dropped::Untracked),
        _ => {}
    }
    let Some(current) = current.filter(|c| c.uid == new.uid) else {
        return Ok(());
    };
    if new.generation < current.generation {
        return Err(Dropped::StaleGeneration);
    }
    if current.state == LifecycleState::Failed
        && current.generation == new.generation
        && !matches!(
            new.state,
            LifecycleState::Failed | LifecycleState::Creating | LifecycleState::Hibernating
        )
    {
        return Err(Dropped::StickyFailed);
    }
    Ok(())
}

/// Cuts `text` to at most `max` bytes on a character boundary.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text[..cut].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(uid: &str, state: LifecycleState, generation: i64) -> Intent {
        Intent {
            uid: uid.into(),
            state,
            generation,
            message: String::new(),
        }
    }

    #[test]
    fn another_tracked_incarnation_drops_the_write() {
        let new = intent("u2", LifecycleState::Failed, 1);
        assert_eq!(admit(None, Some("u1"), &new), Err(Dropped::OtherIncarnation));
        assert_eq!(admit(None, Some("u2"), &new), Ok(()));
    }

    #[test]
    fn an_untracked_writer_cannot_replace_another_incarnations_intent() {
        let cur = intent("u1", LifecycleState::Ready, 1);
        assert_eq!(
            admit(Some(&cur), None, &intent("u2", LifecycleState::Failed, 1)),
            Err(Dropped::Untracked)
        );
        assert_eq!(
            admit(Some(&cur), None, &intent("u1", LifecycleState::Failed, 1)),
            Ok(())
        );
    }

    #[test]
    fn a_lower_generation_is_stale() {
        let cur = intent("u1", LifecycleState::Creating, 3);
        assert_eq!(
            admit(Some(&cur), Some("u1"), &intent("u1", LifecycleState::Ready, 2)),
            Err(Dropped::StaleGeneration)
        );
        assert_eq!(
            admit(Some(&cur), Some("u1"), &intent("u1", LifecycleState::Ready, 3)),
            Ok(())
        );
    }

    #[test]
    fn failed_is_sticky_at_the_same_generation() {
        let cur = intent("u1", LifecycleState::Failed, 2);
        assert_eq!(
            admit(Some(&cur), Some("u1"), &intent("u1", LifecycleState::Ready, 2)),
            Err(Dropped::StickyFailed)
        );
        assert_eq!(
            admit(Some(&cur), Some("u1"), &intent("u1", LifecycleState::Hibernated, 2)),
            Err(Dropped::StickyFailed)
        );
        for ok in [
            LifecycleState::Failed,
            LifecycleState::Creating,
            LifecycleState::Hibernating,
        ] {
            assert_eq!(admit(Some(&cur), Some("u1"), &intent("u1", ok, 2)), Ok(()));
        }
        // A newer generation lifts it.
        assert_eq!(
            admit(Some(&cur), Some("u1"), &intent("u1", LifecycleState::Ready, 3)),
            Ok(())
        );
    }

    #[test]
    fn annotations_round_trip_and_an_empty_message_deletes_its_key() {
        let i = Intent {
            uid: "u".into(),
            state: LifecycleState::Failed,
            generation: 4,
            message: "boom".into(),
        };
        let a = i.annotations();
        assert_eq!(a[STATE].as_deref(), Some("failed"));
        assert_eq!(a[OBSERVED_GENERATION].as_deref(), Some("4"));
        assert_eq!(a[MESSAGE].as_deref(), Some("boom"));
        let flat: BTreeMap<String, String> = a.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect();
        assert_eq!(Intent::from_annotations("u", &flat), Some(i));
        let ready = Intent {
            uid: "u".into(),
            state: LifecycleState::Ready,
            generation: 0,
            message: String::new(),
        };
        assert_eq!(ready.annotations()[MESSAGE], None);
    }

    #[test]
    fn generation_and_truncation() {
        let a = BTreeMap::from([(GENERATION.to_string(), "7".to_string())]);
        assert_eq!(pod_generation(&a), 7);
        assert_eq!(
            pod_generation(&BTreeMap::from([(GENERATION.to_string(), "x".to_string())])),
            0
        );
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
