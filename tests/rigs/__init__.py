"""The tests' rigs: what several test files share, one module per thing it holds (each
module's docstring also says which tests it was first written for).

- ``adoption_and_delivery``: adoption into a parent's sandbox and the runner's delivery: sandbox
  facts, a child node, a store that is down.
- ``bank_store_hooks``: bank stores (filesystem, S3) parametrized, with hooks around their put (a
  store that replaces, a disk that fills), a teardown over them and the checks that the recorded
  bank is fetchable.
- ``checkpoint_stamps``: checkpoint stamps on banks and rewinds, and a service's kept flags.
- ``claiming_runner``: a runner whose claim races: timelines that write first, another execution
  during the engine.
- ``cli_process``: the installed ``scratchbank`` command run as a process.
- ``consent_forms``: each refusal's consent form on every surface.
- ``counted_teardowns``: teardowns in real sandboxes whose execs are counted or stalled.
- ``delivery_timelines``: a timeline that queues before the claim, and a runner with no sandboxes.
- ``explorer_worlds``: the interleaving explorer's worlds (SQLite, PostgreSQL, the runner's), its
  scenarios, seeds and schedule counts.
- ``forked_child``: a call run in a forked child (as another uid, killed at its timeout), and the
  hostile tars it reads (a root directory member, deep implicit parents).
- ``gated_runs``: a run driven step by step: a sandbox, a store and a timeline that wait at a gate,
  and a call in a thread.
- ``host_archive``: the bank as it arrives on the host: raw tars streamed into a HostArchive by each
  codec, a full temp directory.
- ``host_directory_restore``: a bank restored into a host directory through ``resume()``, the digest
  of a tree, and the refusal it must name.
- ``hostile_banks``: hostile banks (PAX records that make the parser fail) and a fake sandbox that
  archives them.
- ``hostile_sandbox``: a sandbox on every transport for the hostile-sandbox tests (H), and PID 1's
  idle proof.
- ``http_api``: the HTTP API over a real loopback socket: a home, its service, a client with the
  token.
- ``image``: the one image built once, and its services and story run inside it.
- ``k8s_provider``: the Kubernetes API double, the provider over it, kubectl and a kubeconfig for
  it, a runner's environment.
- ``landed_records``: timelines whose restore record fails to land, a parked run and a timeline held
  busy.
- ``lease_timing``: a lease with short timings, a stuck archive and provider, a store cut after its
  put, a bounded runner.
- ``limits``: the run of the limits' tests (N4-N6).
- ``lock_processes``: processes that take the run's lock, or hold it and die.
- ``long_timelines``: long timelines for snapshots: appended in batches, counted reads, a timeline
  that refuses whole reads.
- ``lossy_runner``: the runner's lost replies: timelines that lose a reply, move before a queue or
  are overtaken, and leases that are lost.
- ``many_members``: tars of many empty members read under a member log budget.
- ``mcp_client``: the MCP server as a process driven by the SDK's client (stdio, streamable HTTP):
  the assistant's and the human's stories.
- ``one_exec_restore``: a restore in one exec on every transport, counted, with a listing that drops
  a member.
- ``outbox``: the outbox: queued attempts, listings, lost publications and a queue that is down.
- ``queue_deployment``: a deployment of the runner behind the queue (NATS), its event log and the
  CLI's resume through it.
- ``racing_processes``: processes racing on one parked run (resumes and teardowns, SQLite and
  PostgreSQL) and what each got.
- ``real_sandboxes``: the real sandboxes (local, Docker, Podman, the Kubernetes double) with a way
  to run and spawn workload commands in them.
- ``restore_decisions``: the restore's decision from records (``after_restore``) and the results
  that lose or fail to read.
- ``resume_decisions``: the resume gate's decision from records (``decide_resume``) and the consents
  it is asked with.
- ``resume_world``: the resume use case over fakes: a world, its checksum, and the timeline, store
  and sandbox that fail or cut in.
- ``rewind_model``: k9 and K8 read plainly: a model of which writes a rewind takes back, the loop-
  pass records and the hypothesis strategies of timelines with rewinds.
- ``runner_env``: the runner's settings as environment variables.
- ``s3_buckets``: an S3 client and a fresh bucket on the test S3 server, a bank source file and a
  bank stamp.
- ``sandbox_probes``: probes into a real sandbox: a writer that grows a file, frozen or running
  processes, a canonical archive restored as a user.
- ``sandbox_restores``: a restore into a real sandbox (local, Docker BusyBox and GNU) from raw bank
  bytes, and the scratch's fingerprint before and after.
- ``scripted_transport``: a scripted transport for the exec pump (no engine): stalled and failing
  streams, a recording sandbox, and the check that no thread is left.
- ``staged_restore``: the staged restore on every kind of sandbox (fake, local, Docker): a canonical
  bank and its staged listing.
- ``stalls``: what stalls: a TCP proxy that stops forwarding, an endless stream, a sandbox whose
  archive never ends, a PostgreSQL database of its own; the times each stall took.
- ``sweeper``: the orphan sweeper's cutoff and a queued attempt lost before its claim.
- ``swept_cluster``: a cluster of runner processes sweeping orphans on PostgreSQL and NATS, and what
  they did.
- ``tar_reader``: the tar reader driven on raw bytes: header fields, PAX records, a buggy reader, a
  reader's peak memory.
- ``teardown_decisions``: the teardown's plan from records (``plan_teardown``): clean and raced
  archives, a quiesce.
- ``teardown_world``: the teardown use case over fakes: flaky stores and timelines, sandboxes
  claimed during banking or allowed one call.
"""
