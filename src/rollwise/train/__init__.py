"""Policy updates: the SFT warm start and the RL loss, optimizer and trainer."""
