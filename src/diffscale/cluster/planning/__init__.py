"""Planning a job: shapes, workloads, estimates, preflight checks, coupled layouts and the choice
of partition. Pure: no scheduler command runs here except partition_auto's start estimates."""
