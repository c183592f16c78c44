"""The simulated Kunlunxin P800 fleet: sim hosts (systemd + sshd containers on a private
bridge, each with a sparse 14T data disk) carrying a hardware kit below the line the
product sees. Entry points: ``cli.register`` / ``python -m kunlun_fleet.sim``."""
