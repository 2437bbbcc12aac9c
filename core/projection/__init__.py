"""Beyond the measured GPU counts: the cluster network, the step model, the projection and the plan, and the
constants fitted on published scaling results."""
