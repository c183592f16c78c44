"""The sim-fleet suite's fixtures come from kunlun_fleet.sim.testing (sim_fleet: one
3-host fleet per session, torn down only with KF_SIM_TEARDOWN=1; fresh_host)."""

from kunlun_fleet.sim.testing import fresh_host, sim_fleet  # noqa: F401 (pytest fixtures)
