"""Episodes: the runners (lockstep, async, agents behind the endpoint, Ray workers), the pipeline, and the
components they are built from."""
