"""Everything that touches Ray actors: starting or attaching to Ray, sizing and placing actors, the scoring actor, the
scheduler that survives dead actors, and how errors inside actors reach the user."""
