__all__ = ["__version__", "debug", "cuda", "git_version", "hip"]
__version__ = "2.5.1"
debug = False
cuda = "11.7"
git_version = "a8d6afb511a69687bbb2b7e88a3cf67917e1697e"
hip = None
xmlir = "3.3.1.0"
