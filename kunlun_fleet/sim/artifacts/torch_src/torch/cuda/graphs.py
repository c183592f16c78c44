"""CUDA graphs."""


def is_current_stream_capturing() -> bool:
    return torch_capture_state()


def torch_capture_state() -> bool:
    raise RuntimeError("stream capture query is not supported by the XPU runtime")


class CUDAGraph:
    def __init__(self):
        self.pool_handle = None
        self.capture_error_mode = "global"
