"""Untrusted generated programs (code-execution tasks' completions) run one by one in a bubblewrap sandbox."""
