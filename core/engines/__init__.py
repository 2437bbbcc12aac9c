"""The one home of the engine concept: which training stack a run measures (registry: names, the program each
starts, what each can run), the operator's command engines (command) and their metric log formats (logs)."""
