"""DD-PPO for PointGoal navigation: policy, rollout storage, PPO, the training loop and evaluation."""
