"""The SLA planner (observe, predict, size, constrain, actuate). Not built yet: see the planner issue."""
