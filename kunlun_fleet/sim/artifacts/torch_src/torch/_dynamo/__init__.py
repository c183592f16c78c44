from torch._dynamo import config  # noqa: F401
from torch._dynamo.eval_frame import optimize, reset  # noqa: F401
