"""Reading benchmark rows from files or the hub, each row keeping its file and row number for errors; the built-in
demo's paths."""
