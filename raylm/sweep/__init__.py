"""`raylm sweep`: sweep files -> models x points, one model-resident actor per model, then summaries and plots."""
