/* vllm_kunlun._kunlun: native helpers of the Kunlun platform plugin. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#ifndef VLLM_KUNLUN_VERSION
#define VLLM_KUNLUN_VERSION "0.0.0"
#endif
#ifndef VLLM_KUNLUN_COMMIT
#define VLLM_KUNLUN_COMMIT "unknown"
#endif

/* Count /dev/xpuN nodes (the kunlun driver's device files). */
static PyObject *kunlun_device_nodes(PyObject *self, PyObject *args) {
    const char *dir = "/dev";
    if (!PyArg_ParseTuple(args, "|s", &dir)) return NULL;
    DIR *d = opendir(dir);
    if (!d) return PyLong_FromLong(0);
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "xpu", 3) == 0 && e->d_name[3] >= '0' && e->d_name[3] <= '9') {
            const char *p = e->d_name + 3;
            while (*p >= '0' && *p <= '9') p++;
            if (*p == '\0') n++;
        }
    }
    closedir(d);
    return PyLong_FromLong(n);
}

/* silu(x) * y over two equal-length float sequences (reference for the fused kernel). */
static PyObject *kunlun_silu_and_mul(PyObject *self, PyObject *args) {
    PyObject *a, *b;
    if (!PyArg_ParseTuple(args, "OO", &a, &b)) return NULL;
    PyObject *fa = PySequence_Fast(a, "expected a sequence");
    if (!fa) return NULL;
    PyObject *fb = PySequence_Fast(b, "expected a sequence");
    if (!fb) { Py_DECREF(fa); return NULL; }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fa);
    if (n != PySequence_Fast_GET_SIZE(fb)) {
        Py_DECREF(fa); Py_DECREF(fb);
        PyErr_SetString(PyExc_ValueError, "silu_and_mul: length mismatch");
        return NULL;
    }
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; i < n; i++) {
        double x = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fa, i));
        double y = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fb, i));
        if (PyErr_Occurred()) { Py_DECREF(fa); Py_DECREF(fb); Py_DECREF(out); return NULL; }
        double s = x / (1.0 + exp(-x));
        PyList_SET_ITEM(out, i, PyFloat_FromDouble(s * y));
    }
    Py_DECREF(fa); Py_DECREF(fb);
    return out;
}

static PyObject *kunlun_version(PyObject *self, PyObject *noargs) {
    return Py_BuildValue("(ss)", VLLM_KUNLUN_VERSION, VLLM_KUNLUN_COMMIT);
}

static PyMethodDef methods[] = {
    {"device_nodes", kunlun_device_nodes, METH_VARARGS, "Count /dev/xpuN nodes in a directory."},
    {"silu_and_mul", kunlun_silu_and_mul, METH_VARARGS, "silu(a) * b, element-wise."},
    {"version", kunlun_version, METH_NOARGS, "(version, commit) this extension was built from."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kunlun", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kunlun(void) { return PyModule_Create(&module); }
