"""The rollout queue: its service, its state, its SQLite store and the trainer's recovery calls."""
