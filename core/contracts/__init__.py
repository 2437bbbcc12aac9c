"""What travels between the parts of the service: specs and results, clusters, the matrix, schedules."""
