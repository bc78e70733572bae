# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Each creates the virtualenv and installs the pinned packages by itself:
# setup.py states the ranges autopar accepts, constraints.txt the exact
# versions make and CI install.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONSTRAINTS := constraints.txt

.PHONY: demo demo-keras test check install clean native stress system-packages

$(STAMP): setup.py pyproject.toml $(CONSTRAINTS) runtime/coordinator.proto transforms/fusion_layout.proto cpp_ops/bind_shim.c \
		cpp_ops/herring_ops.cc cpp_ops/sum_server.cc cpp_ops/herring_wire.h \
		cpp_ops/fusion_buffer_reader.h
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c $(CONSTRAINTS) -e ".[cpu,test]"
	# Legacy Keras for programs built with tf.compat.v1.layers (docs/tf2-keras.md,
	# "Legacy Keras"), beside the venv, not in it: tf-keras requires
	# the full tensorflow package (not tensorflow-cpu), and on the default path
	# it would make every TensorFlow import load it.
	$(PY) -m pip install -q --no-deps --upgrade --target $(VENV)/legacy-keras -c $(CONSTRAINTS) tf-keras
	$(MAKE) native
	$(MAKE) system-packages
	touch $(STAMP)

# Installed with apt when run as root and missing: nftables, for the per-job
# firewall rules of jobs on non-loopback addresses (docs/security.md; without
# it such jobs warn what stays exposed); OpenMPI's mpirun, OpenSSH's sshd and
# client and Slurm's daemons and srun, which the tests start jobs with
# (docs/cluster.md; without them those tests say why they skip). A
# policy-rc.d, where none exists, keeps apt from starting a system sshd or
# Slurm for the while (the tests run their own).
system-packages:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		made=; if [ ! -e /usr/sbin/policy-rc.d ]; then \
			printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; made=1; \
		fi; \
		for pkg in nft:nftables mpirun:openmpi-bin /usr/sbin/sshd:openssh-server ssh:openssh-client \
				/usr/sbin/slurmctld:slurm-wlm; do \
			cmd=$${pkg%%:*}; name=$${pkg#*:}; \
			if ! command -v $$cmd >/dev/null; then \
				echo "installing $$name (apt-get)"; \
				(apt-get install -y -qq $$name >/dev/null 2>&1 || \
				 (apt-get update -qq && apt-get install -y -qq $$name >/dev/null)) || \
				echo "could not install $$name"; \
			fi; \
		done; \
		if [ -n "$$made" ]; then rm -f /usr/sbin/policy-rc.d; fi; \
	fi

# The coordinator's gRPC modules (from runtime/coordinator.proto), the bind
# shim (cpp_ops/bind_shim.c, needs a C compiler) and the summation server
# (cpp_ops/sum_server.cc, needs a C++17 compiler) into runtime/, as setup.py's
# build does for `pip install .`; and the Herring op library
# (cpp_ops/herring_ops.cc against the installed TensorFlow) into the per-user
# build cache, where its first use would otherwise build it (cpp_ops/README.md).
native:
	$(PY) -m autopar.runtime.native

install: $(STAMP)

# Digits MLP on 2 local worker processes: report, progress, final accuracy.
demo: $(STAMP)
	$(PY) examples/digits_mlp.py --spec resource_specs/localhost_2workers.yaml

# A Keras 3 model trained with fit() (autopar.fit) on 2 local worker processes:
# per-epoch logs and the test accuracy, the same as on one device.
demo-keras: $(STAMP)
	$(PY) examples/keras_fit.py --spec resource_specs/localhost_2workers.yaml

# On two pytest-xdist workers: the jobs' processes often wait on each other
# or on the network, and one lane left about 40 % of the two cores idle.
# conftest.py keeps each file's tests on one worker and the files that use
# machine-wide resources on the same one.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --durations=30 tests

# Before a commit (under 3 minutes on 2 cores): ruff's lint (pyproject.toml)
# and the fast unit tests (not pytest.ini's `slow` ones: the integration,
# cluster and install folders, and the unit tests that start processes,
# build a wheel or take seconds, which `make test` runs too).
.PHONY: check
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -m "not slow" tests/unit

# autopar as a pip user gets it (tests/install): a fresh virtualenv with the
# other TensorFlow distribution of the pinned release (`tensorflow`), autopar
# pip-installed into it from a copy of the sources, a herring job equal to one
# device there, its TensorBoard, every example from a folder outside the
# checkout. Minutes (a 570 MB TensorFlow wheel), so not part of `make test`;
# CI runs both (.ci/run).
.PHONY: test-install
test-install: $(STAMP)
	$(PY) -m pytest -q tests/install

# GPU workers on a machine with GPUs (tests/gpu/check.py, docs/gpus.md): 2 workers
# (a GPU each, or sharing one), hybrid and allreduce, equal to one device, and the
# device each worker's MatMuls ran on. Exits 77 on a machine without a GPU.
# Not part of CI (no GPU there).
.PHONY: gpu-check
gpu-check: $(STAMP)
	$(PY) tests/gpu/check.py

# Soaks: ten fresh parameter-server jobs per run option (the start-up race),
# five rounds of two jobs launched together on one port range, Ctrl-C at each
# point of the launcher's start-up twenty times.
stress: $(STAMP)
	AUTOPAR_STRESS_REPEATS=10 AUTOPAR_PORT_ROUNDS=5 AUTOPAR_STARTUP_PRESSES=20 \
		$(PY) -m pytest -q tests/integration/test_ps_stress.py \
		tests/integration/test_ports_launch.py \
		"tests/integration/test_launcher.py::test_ctrl_c_at_each_point_of_the_start_up_stops_the_job"

# Programs users bring in every run option (the suite runs each run option
# once): the Keras 3 custom step and fit() tests over the full matrix.
.PHONY: test-matrix
test-matrix: $(STAMP)
	AUTOPAR_TEST_MATRIX=full $(PY) -m pytest -q -n 2 tests/integration/test_keras_programs.py \
		tests/integration/test_user_programs.py tests/integration/test_cnn_benchmarks_resnet.py \
		tests/integration/test_ported_programs.py tests/integration/test_keras_io_ports.py \
		tests/integration/test_script_shapes.py tests/integration/test_examples.py

clean:
	rm -rf $(VENV) *.egg-info

# The generated documentation: docs/config.md (from autopar/config.py's field
# docstrings), docs/benchmarks.md and the README's headline numbers (from
# bench/results/*.json). tests/unit/test_docs.py fails when they are stale.
.PHONY: docs
docs: $(STAMP)
	$(PY) -m docs.generate

# Benchmarks (need root: they build an emulated cluster of network namespaces).
# bench-setup builds the Horovod peer's own virtualenv once (bench/.venv-horovod,
# TensorFlow 2.12 + Horovod 0.28.1, a few minutes); the bench targets build it
# too when it is missing. Results: bench/results/<quick|full>.{json,md,png}.
.PHONY: bench-setup bench-quick bench bench-herring bench-messages bench-ps-bytes bench-groups \
	bench-allreduce-groups
BENCH_ROOT_CHECK = $(PY) -c 'from bench.cluster import require_root; require_root()'

bench-setup: $(STAMP)
	$(PY) -m bench.horovod_env

# 2, 4 and 8 hosts, sparse LM at 100 Mbit/s, every peer and the compute floor (~5 min).
# A Horovod venv that cannot be built is recorded as the Horovod peer's failure.
bench-quick: $(STAMP)
	$(BENCH_ROOT_CHECK)
	$(PY) -m bench.run --quick --update-readme
	$(MAKE) docs   # the benchmark page and README numbers from the new results

# 2, 4 and 8 hosts at 1000 and 100 Mbit/s, every workload (microbenchmark at 100 MiB, sparse LM, dense CNN).
bench: $(STAMP)
	$(BENCH_ROOT_CHECK)
	$(PY) -m bench.run
	$(MAKE) docs   # the benchmark page and README numbers from the new results

# Herring against the rings (issue 10), at 1000 and at 100 Mbit/s, S = N summation-server hosts:
# the microbenchmark (G = 100 MiB float32) at 2, 4 and 8 hosts with the floor, Horovod/Gloo,
# the TF collective (tf_mwms), autopar-allreduce and autopar-herring; the dense CNN at 4 and
# 8 hosts with the floor, Horovod, autopar-allreduce and autopar-herring.
# Results: bench/results/herring.{json,md,png}.
bench-herring: $(STAMP)
	$(BENCH_ROOT_CHECK)
	$(PY) -m bench.run --name herring --link-mbit 1000,100 --hosts 2,4,8 --servers equal \
		--workloads avg,dense --avg-mib 100 \
		--peers floor,horovod,tf_mwms,autopar-allreduce,autopar-herring \
		--workload-hosts dense=4,8 --workload-peers dense=floor,horovod,autopar-allreduce,autopar-herring
	$(MAKE) docs   # the benchmark page and README numbers from the new results

# What a message costs (issue 31 item 5): the microbenchmark at G = 1 MiB on 1000 Mbit/s
# links, where every system's step is its messages, not its bytes: 2, 4 and 8 hosts,
# S = N servers (a PS variable in one partition per server: 2 N S RPCs per step),
# every peer the simulator models; and the sparse LM at 1000 Mbit/s, the configurations
# of the full run, which pin this run's CPU speed in the fit (~10 min). bench/simulate.py
# fits on it beside full.json and quick.json. Results: bench/results/messages.{json,md,png}.
bench-messages: $(STAMP)
	$(BENCH_ROOT_CHECK)
	$(PY) -m bench.run --name messages --link-mbit 1000 --hosts 2,4,8 --servers equal \
		--workloads avg,sparse --avg-mib 1 --steps avg=3:30 \
		--peers floor,tf_mwms,tf_ps,horovod,autopar-allreduce,autopar-ps,autopar-hybrid
	$(MAKE) docs   # the benchmark page and README numbers from the new results

# The parameter-server peers' CPU per byte (issue 61 item 2): the 100 MiB microbenchmark, the
# dense CNN and the sparse LM at 1000 Mbit/s, 2, 4 and 8 hosts, S = N servers, the floor,
# TF-PS and autopar-ps (~15 min). bench/simulate.py fits it with the runs above; autopar-ps's
# points of older runs measured a server path since changed (SUPERSEDED_BEFORE).
# Results: bench/results/ps_bytes.{json,md,png}.
bench-ps-bytes: $(STAMP)
	$(BENCH_ROOT_CHECK)
	$(PY) -m bench.run --name ps_bytes --link-mbit 1000 --hosts 2,4,8 --servers equal \
		--workloads avg,dense,sparse --peers floor,tf_ps,autopar-ps
	$(MAKE) docs   # the benchmark page and README numbers from the new results

# Config.aggregation_group on the emulated cluster: hybrid on the sparse LM, 8 hosts, S = 8
# servers, 1000 and 100 Mbit/s, groups of 1, 2, 4 and 8 workers (one run each, ~6 min).
# bench/simulate.py compares them with its predictions (not fitted). Results:
# bench/results/groups_g{1,2,4,8}.{json,md,png}.
bench-groups: $(STAMP)
	$(BENCH_ROOT_CHECK)
	for g in 1 2 4 8; do \
		$(PY) -m bench.run --name groups_g$$g --hosts 8 --workloads sparse --link-mbit 1000,100 \
			--servers equal --steps sparse=3:20 --peers autopar-hybrid \
			--autopar-config "{\"aggregation_group\": $$g}" || exit 1; \
	done

# Config.allreduce_group (2-D summation of the dense all-reduce over groups): the
# flat ring, groups of 2 and 4, twice each, then the planner's default; hybrid,
# sparse LM, 8 hosts at 1000 Mbit/s (~4 min). bench/simulate.py takes the CPU
# of the groups' extra collectives from these runs.
bench-allreduce-groups: $(STAMP)
	$(BENCH_ROOT_CHECK)
	for rep in 1 2; do for d in 0 2 4; do \
		$(PY) -m bench.run --name allreduce_groups_d$${d}_r$$rep --hosts 8 --workloads sparse \
			--link-mbit 1000 --servers equal --steps sparse=3:20 --peers autopar-hybrid \
			--autopar-config "{\"allreduce_group\": $$d}" || exit 1; \
	done; done
	$(PY) -m bench.run --name allreduce_groups_auto --hosts 8 --workloads sparse --link-mbit 1000 \
		--servers equal --steps sparse=3:20 --peers autopar-hybrid

# Analysis and rewrite time vs graph size: a BERT-style encoder at 3, 6, 12
# and 24 layers (no root needed; minutes, most of it the rewrite). Results:
# bench/results/transform_scale.{json,png}. TRANSFORM_ARGS passes options, e.g.
# TRANSFORM_ARGS="--layers 12 24 --skip-rewrite". transform-scale-e2e: the
# 24-layer graph on 2 local workers, launch to two finished steps, by phase.
# The alpha-beta-gamma simulator (bench/simulate.py): fits its constants to the
# committed bench/results/{full,quick,messages}.json and projects to 16-512 workers and to
# Parallax's cluster; writes bench/results/simulate.{json,md,png}. Seconds, no root.
.PHONY: simulate
simulate: $(STAMP)
	$(PY) -m bench.simulate
	$(MAKE) docs   # the benchmark page and README numbers from the new results

.PHONY: transform-scale transform-scale-e2e
transform-scale: $(STAMP)
	$(PY) -m bench.transform_scale $(TRANSFORM_ARGS)
	$(MAKE) docs   # the benchmark page and README numbers from the new results

transform-scale-e2e: $(STAMP)
	$(PY) -m bench.transform_scale --end-to-end $(TRANSFORM_ARGS)

# Large-batch techniques (bench/large_batch.py): a 52 M-parameter MLP with Adam,
# 4 local workers with and without weight-update sharding, then (root: emulated
# cluster, prefix aplb) 2 hosts x 2 workers with and without 2-D summation.
# Results: bench/results/large_batch.{json,png}. LARGE_BATCH_ARGS passes options.
.PHONY: bench-large-batch
bench-large-batch: $(STAMP)
	$(BENCH_ROOT_CHECK)
	$(PY) -m bench.large_batch $(LARGE_BATCH_ARGS)
	$(MAKE) docs   # the benchmark page and README numbers from the new results
