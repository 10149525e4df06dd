"""`raylm eval`'s driver (driver.py) and how it starts (startup.py)."""

from raylm.evaluate.driver import (
    evaluate,
    log_native_samples,
    run_fingerprint,
    run_lmeval_requests,
    run_prompt,
    run_selection,
    run_settings,
    run_task_docs,
)

__all__ = ["evaluate", "log_native_samples", "run_fingerprint", "run_lmeval_requests", "run_prompt", "run_selection",
           "run_settings", "run_task_docs"]
