//! What the server serves, decided at start: the task its files say
//! (sentence-transformers' `modules.json` or GGUF's pooling type: embed; an
//! encoder, which cannot generate: embed; a `*ForSequenceClassification`:
//! score; else generate), unless `--task` says otherwise; and for an
//! embedding model how it pools, unless `--pooling` says otherwise (with a
//! warning: a model pooled otherwise than trained gives plausible, wrong
//! vectors).

use ferrox_models::pooling::config::PoolingFiles;
use ferrox_models::pooling::{Pooling, PoolingMethod};
use ferrox_plan::Task;

/// What the model serves, and how an embedding model pools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The task.
    pub task: Task,
    /// The pooling, for an embedding model.
    pub pooling: Option<Pooling>,
}

/// The task a model's files say (`inspect` reports it to the operator):
/// a classifier scores; sentence-transformers' pooling or an encoder
/// embeds; else it generates.
pub fn found(files: &PoolingFiles, encoder: bool) -> Task {
    if files.classifier {
        Task::Score
    } else if files.pooling.is_some() || encoder {
        Task::Embed
    } else {
        Task::Generate
    }
}

/// The task and pooling of a model whose files say `files`; `encoder`: its
/// layers keep no cache (it cannot generate). `task` and `pooling` are the
/// flags.
pub fn decide(
    files: &PoolingFiles,
    encoder: bool,
    task: Option<Task>,
    pooling: Option<PoolingMethod>,
) -> anyhow::Result<Served> {
    let found = found(files, encoder);
    let task = task.unwrap_or(found);
    if task != found {
        tracing::info!(found = %found, task = %task, "--task overrides what the model's files say");
    }
    match task {
        // A decoder reads its last token's state: through its classifier
        // (*ForSequenceClassification), or a reranker's (Qwen3-Reranker)
        // through its "yes" and "no" logits.
        Task::Score if !encoder => Ok(Served {
            task,
            pooling: Some(Pooling {
                method: PoolingMethod::Last,
                normalize: false,
            }),
        }),
        // The classifier reads the first token's state.
        Task::Score => Ok(Served {
            task,
            pooling: Some(Pooling {
                method: PoolingMethod::Cls,
                normalize: false,
            }),
        }),
        Task::Generate if encoder => anyhow::bail!(
            "this model is an encoder: it embeds and cannot generate text (--task embed)"
        ),
        Task::Generate => {
            if pooling.is_some() {
                tracing::warn!("--pooling is ignored: the model generates (--task generate)");
            }
            Ok(Served {
                task,
                pooling: None,
            })
        }
        Task::Embed => Ok(Served {
            task,
            pooling: Some(embed_pooling(files.pooling, encoder, pooling)),
        }),
    }
}

/// The pooling of an embedding model: its files', else an encoder's CLS or
/// a decoder's last token, normalized (vLLM's defaults); `--pooling`
/// replaces the method.
fn embed_pooling(files: Option<Pooling>, encoder: bool, flag: Option<PoolingMethod>) -> Pooling {
    let default = Pooling {
        method: if encoder {
            PoolingMethod::Cls
        } else {
            PoolingMethod::Last
        },
        normalize: true,
    };
    let found = files.unwrap_or(default);
    match flag {
        Some(m) if m != found.method => {
            tracing::warn!(
                files = %found.method,
                pooling = %m,
                "--pooling overrides the model's own pooling: its vectors will differ from \
                 those it was trained to give"
            );
            Pooling { method: m, ..found }
        }
        _ => found,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(pooling: Option<Pooling>, classifier: bool) -> PoolingFiles {
        PoolingFiles {
            pooling,
            classifier,
            ..PoolingFiles::default()
        }
    }

    #[test]
    fn the_task_and_pooling_come_from_the_files_unless_flagged() {
        let p = |method, normalize| Pooling { method, normalize };
        let st = Some(p(PoolingMethod::Mean, false));
        type Case = (
            PoolingFiles,
            bool,
            Option<Task>,
            Option<PoolingMethod>,
            Result<(Task, Option<Pooling>), &'static str>,
        );
        let cases: Vec<Case> = vec![
            // A decoder with no pooling files generates.
            (
                files(None, false),
                false,
                None,
                None,
                Ok((Task::Generate, None)),
            ),
            // sentence-transformers' files: embed as they say.
            (files(st, false), false, None, None, Ok((Task::Embed, st))),
            // An encoder embeds, CLS and normalized by default.
            (
                files(None, false),
                true,
                None,
                None,
                Ok((Task::Embed, Some(p(PoolingMethod::Cls, true)))),
            ),
            // A decoder told to embed: its last token.
            (
                files(None, false),
                false,
                Some(Task::Embed),
                None,
                Ok((Task::Embed, Some(p(PoolingMethod::Last, true)))),
            ),
            // --pooling replaces the method, keeps the normalization.
            (
                files(st, false),
                false,
                None,
                Some(PoolingMethod::Cls),
                Ok((Task::Embed, Some(p(PoolingMethod::Cls, false)))),
            ),
            // An embedding model told to generate.
            (
                files(st, false),
                false,
                Some(Task::Generate),
                None,
                Ok((Task::Generate, None)),
            ),
            (
                files(None, false),
                true,
                Some(Task::Generate),
                None,
                Err("cannot generate"),
            ),
            // A cross-encoder scores its pairs through the first token.
            (
                files(None, true),
                true,
                None,
                None,
                Ok((Task::Score, Some(p(PoolingMethod::Cls, false)))),
            ),
            // A decoder told to score: Qwen3-Reranker's last token.
            (
                files(None, false),
                false,
                Some(Task::Score),
                None,
                Ok((Task::Score, Some(p(PoolingMethod::Last, false)))),
            ),
            // A decoder with a classification head scores through its
            // last token.
            (
                files(None, true),
                false,
                None,
                None,
                Ok((Task::Score, Some(p(PoolingMethod::Last, false)))),
            ),
        ];
        for (f, encoder, task, pooling, want) in cases {
            let got = decide(&f, encoder, task, pooling);
            match (got, want) {
                (Ok(s), Ok((t, p))) => assert_eq!((s.task, s.pooling), (t, p), "{f:?} {task:?}"),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e}"),
                (g, w) => panic!("{f:?} {task:?}: {g:?} vs {w:?}"),
            }
        }
    }
}
