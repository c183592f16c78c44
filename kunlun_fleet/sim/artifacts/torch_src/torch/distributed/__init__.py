from torch.distributed.distributed_c10d import get_backend, is_nccl_available  # noqa: F401
