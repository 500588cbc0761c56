"""wagma_rl: distributed RL (DD-PPO for PointNav) and a straggler-tolerant optimizer API (WAGMA)."""
