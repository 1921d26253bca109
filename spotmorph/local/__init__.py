"""The local cluster: a controller, a simulated platform and agent processes on this machine.

- :mod:`.layout`: the cluster directory, one class naming every file in it;
- :mod:`.processes`: spawn, alive, terminate with grace, wait for a condition (a timeout quotes a log);
- :mod:`.provider`: the controller's ``provider: local`` (every "VM" an agent process) and ``kill_vm``;
- :mod:`.clouds`: which cloud the cluster plays (``up --cloud``), and where each VM's agent finds its metadata;
- :mod:`.imds_server`: a Scheduled Events service that speaks Azure's IMDS protocol; :mod:`.aws_metadata` and
  :mod:`.gcp_metadata`: AWS's IMDSv2 and GCP's metadata server (each VM's own, :mod:`.metadata_http`);
- :mod:`.platform`: the platform process serving the cluster's cloud, which evicts VMs as that cloud does;
- :mod:`.replay`: adds and evictions driven by an availability trace;
- :mod:`.cluster`: ``up`` and ``down``, and the client context that points at the cluster;
- :mod:`.harness`: driving a cluster from the demo, the benchmarks and the end-to-end tests;
- :mod:`.postgres`: a throwaway PostgreSQL server in a temporary directory, for the tests and ``--database``.

It lives under the composition root because it starts everything else as processes; the controller
gets the local provider injected (``spotmorph controller`` registers it), never imports it.
"""
