"""What every rlax process does the same way: preemption notices, the terminal, its run directory."""
