"""lm-evaluation-harness 0.4.13's own task layer as a raylm task source: every loglikelihood task, group and tag.

Everything that defines a task stays lm-eval's: names resolve through its TaskManager (names.py, with the
index kept fast by index_cache.py), its Task objects build the requests (build.py), and its process_results,
filters, aggregation and group code turn scores back into its results (raylm.results.lmeval). raylm only
tokenises the requests, scores them on its actors, and hands the scores back.

lm-eval is the optional `tasks` extra, so nothing here is imported unless a run asks for a non-native name.

lm-eval's bootstrap_stderr (the stderr of f1, mcc, bleu, perplexity and the other metrics it bootstraps) forks a
multiprocessing pool unless DISABLE_MULTIPROC is set. Every process that imports this package holds Ray's threads
(a driver, RayLM under lm-eval's own evaluator) or torch's, and forking such a process can hang the child. Its
single-process path draws the same replicates (random.Random(i) per chunk of 1,000, in order), so the numbers are
lm-eval's either way; a user who sets DISABLE_MULTIPROC themselves keeps their value.
"""

import os

os.environ.setdefault("DISABLE_MULTIPROC", "1")
