"""--wandb_args: a finished run's results and samples logged to Weights & Biases by lm-eval's own WandbLogger.

The logger does what it does for `lm_eval --wandb_args`: wandb.init with those arguments (config arguments
added to the run's config), the metrics under `<task>/<metric>`, the results as the table
`evaluation/eval_results` (and `evaluation/group_eval_results`), results.json as an artifact, and each task's
samples as a table with --log_samples. lm-eval logs a failed W&B upload as a note and carries on; raylm logs after
its results are written and stops with the error, so a run that was asked to be logged is never passed off as
logged.
"""

from __future__ import annotations

from typing import Any

from raylm.errors import RaylmError

INSTALL = "pip install 'raylm[wandb]'"


def require_wandb() -> None:
    """Checked before a run starts, so that a missing wandb costs no evaluation."""
    try:
        import wandb  # noqa: F401
        from lm_eval.loggers import WandbLogger  # noqa: F401
    except ImportError as e:
        raise RaylmError(f"--wandb_args needs wandb and lm-eval ({e.name} is not installed): {INSTALL}") from None


def log_to_wandb(init_args: dict[str, Any], config_args: dict[str, Any] | None, results: dict[str, Any],
                 samples: dict[str, list[dict[str, Any]]] | None) -> None:
    """One W&B run for these results (lm-eval's shape, samples apart), as lm-eval's CLI drives its WandbLogger."""
    require_wandb()
    from lm_eval.loggers import WandbLogger

    logger = WandbLogger(dict(init_args), dict(config_args or {}))
    try:
        logger.post_init(results)
        logger.log_eval_result()
        if samples:
            logger.log_eval_samples(samples)
    finally:
        logger.run.finish()
