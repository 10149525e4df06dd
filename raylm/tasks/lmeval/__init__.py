"""lm-evaluation-harness 0.4.13's own task layer as a raylm task source: every loglikelihood task, group and tag.

Everything that defines a task stays lm-eval's: names resolve through its TaskManager (names.py, with the
index kept fast by index_cache.py), its Task objects build the requests (build.py), and its process_results,
filters, aggregation and group code turn scores back into its results (raylm.results.lmeval). raylm only
tokenises the requests, scores them on its actors, and hands the scores back.

lm-eval is the optional `tasks` extra, so nothing here is imported unless a run asks for a non-native name.
"""
