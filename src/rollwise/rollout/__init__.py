"""The rollout engine and its cost accounting."""
