"""`raylm probe`: fill-mask predictions of masked LMs, and matched-sentence probe files."""
