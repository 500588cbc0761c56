/* Python binding of the engine (wa.h): the low-level type native_coll._native.Engine. The public
 * Python API (argument checking, CollectiveInfo) lives in native_coll/collective.py.
 * Blocking calls release the GIL so other Python threads run while a rank waits. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "wa.h"

/* native_coll.CollectiveTimeout and native_coll.NonFiniteResult, set at import */
static PyObject *timeout_error_cls = NULL, *nonfinite_error_cls = NULL;

typedef struct {
  PyObject_HEAD wa_engine *e;
  int nranks;
} EngineObject;

static PyObject *int_tuple(const int *v, int n) {
  PyObject *t = PyTuple_New(n);
  if (!t) return NULL;
  for (int i = 0; i < n; i++) {
    PyObject *x = PyLong_FromLong(v[i]);
    if (!x) {
      Py_DECREF(t);
      return NULL;
    }
    PyTuple_SET_ITEM(t, i, x);
  }
  return t;
}

/* native_coll.CollectiveTimeout once the package registered it, else the built-in. */
static PyObject *timeout_cls(void) {
  return timeout_error_cls ? timeout_error_cls : PyExc_TimeoutError;
}

/* Raise the Python exception for rc; info: what the failed call filled in (NULL: nothing). */
static PyObject *raise_for(wa_engine *e, int rc, const wa_info *info) {
  const char *msg = e ? wa_last_error(e) : "engine is not initialised";
  switch (rc) {
  case WA_ENONFINITE: {
    PyObject *cls = nonfinite_error_cls ? nonfinite_error_cls : PyExc_FloatingPointError;
    PyObject *exc = PyObject_CallFunction(cls, "sLO", msg,
                                          (long long)(info ? info->iteration : -1),
                                          info && info->nonfinite_own ? Py_True : Py_False);
    if (exc) {
      PyErr_SetObject(cls, exc);
      Py_DECREF(exc);
    }
    break;
  }
  case WA_EINVAL:
    PyErr_SetString(PyExc_ValueError, msg);
    break;
  case WA_ETIMEOUT:
  case WA_EPEER: {
    const int *ranks;
    int n = wa_failed_ranks(e, &ranks);
    PyObject *rt = int_tuple(ranks, n);
    PyObject *cls = timeout_cls();
    PyObject *exc = rt ? PyObject_CallFunction(cls, "sO", msg, rt) : NULL;
    Py_XDECREF(rt);
    if (exc) {
      PyErr_SetObject(cls, exc);
      Py_DECREF(exc);
    }
    break;
  }
  case WA_ENOMEM:
    PyErr_SetString(PyExc_MemoryError, msg[0] ? msg : "native_coll: out of memory");
    break;
  case WA_ECLOSED:
    PyErr_SetString(PyExc_RuntimeError, "the collective is closed; create a new one");
    break;
  case WA_EBUSY:
    PyErr_SetString(PyExc_RuntimeError, "another thread is inside a call on this collective; "
                                        "use one collective per thread");
    break;
  default:
    PyErr_Format(PyExc_RuntimeError, "native_coll: %s", msg[0] ? msg : "MPI error");
  }
  return NULL;
}

static int Engine_init(EngineObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"comm_addr",       "buf_addr",    "n",       "group_size", "sync_period",
                           "start_iteration", "global_mode", "timeout", NULL};
  unsigned long long comm_addr, buf_addr, n;
  int group_size, global_mode;
  long long sync_period, start_iteration;
  double timeout;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "KKKiLLid", kwlist, &comm_addr, &buf_addr, &n,
                                   &group_size, &sync_period, &start_iteration, &global_mode,
                                   &timeout))
    return -1;
  if (self->e) {
    PyErr_SetString(PyExc_RuntimeError, "Engine is already initialised");
    return -1;
  }
  MPI_Comm comm = *(MPI_Comm *)(uintptr_t)comm_addr;
  char err[512] = "";
  int rc;
  wa_engine *e = NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = wa_create(comm, (float *)(uintptr_t)buf_addr, (size_t)n, group_size, sync_period,
                 start_iteration, global_mode, timeout, &e, err, sizeof err);
  Py_END_ALLOW_THREADS
  if (rc != WA_OK) {
    PyObject *cls = rc == WA_EINVAL     ? PyExc_ValueError
                    : rc == WA_ETIMEOUT ? timeout_cls()
                                        : PyExc_RuntimeError;
    PyErr_SetString(cls, err);
    return -1;
  }
  self->e = e;
  if (MPI_Comm_size(comm, &self->nranks) != MPI_SUCCESS) {
    PyErr_SetString(PyExc_RuntimeError, "native_coll: MPI_Comm_size failed");
    return -1; /* self->e is freed by dealloc */
  }
  return 0;
}

static void Engine_dealloc(EngineObject *self) {
  if (self->e) {
    wa_engine *e = self->e;
    self->e = NULL;
    Py_BEGIN_ALLOW_THREADS
    wa_destroy(e);
    Py_END_ALLOW_THREADS
  }
  Py_TYPE(self)->tp_free((PyObject *)self);
}

#define NEED_ENGINE(self)                                                         \
  if (!(self)->e) {                                                               \
    PyErr_SetString(PyExc_RuntimeError, "the collective is closed; create a new one"); \
    return NULL;                                                                  \
  }

static PyObject *info_tuple(const wa_info *info) {
  PyObject *group = int_tuple(info->group, info->group_len);
  PyObject *stale = int_tuple(info->stale, info->stale_len);
  if (!group || !stale) {
    Py_XDECREF(group);
    Py_XDECREF(stale);
    return NULL;
  }
  return Py_BuildValue("(LNNNLdLLiL)", (long long)info->iteration,
                       PyBool_FromLong(info->is_global), group, stale,
                       (long long)info->staleness, info->wait_s,
                       (long long)info->applied_global, (long long)info->global_lag, info->nodes,
                       (long long)info->bytes_sent);
}

static PyObject *Engine_allreduce(EngineObject *self, PyObject *args) {
  int late = WA_LATE_MERGE, reset = 0;
  if (!PyArg_ParseTuple(args, "ip", &late, &reset)) return NULL;
  NEED_ENGINE(self);
  wa_info info = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = wa_allreduce(self->e, late, reset, &info);
  Py_END_ALLOW_THREADS
  if (rc != WA_OK) return raise_for(self->e, rc, &info);
  return info_tuple(&info);
}

/* settle and synchronize: a blocking call with the GIL released -> the info tuple. */
static PyObject *info_call(EngineObject *self, int (*call)(wa_engine *, wa_info *)) {
  NEED_ENGINE(self);
  wa_info info = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = call(self->e, &info);
  Py_END_ALLOW_THREADS
  if (rc != WA_OK) return raise_for(self->e, rc, &info);
  return info_tuple(&info);
}

static PyObject *Engine_settle(EngineObject *self, PyObject *unused) {
  return info_call(self, wa_settle);
}

static PyObject *Engine_synchronize(EngineObject *self, PyObject *unused) {
  return info_call(self, wa_synchronize);
}

static PyObject *Engine_describe_ranks(EngineObject *self, PyObject *seq) {
  NEED_ENGINE(self);
  PyObject *fast = PySequence_Fast(seq, "describe_ranks takes a list of str, one per rank");
  if (!fast) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  const char **where = calloc((size_t)n + 1, sizeof *where);
  if (!where) {
    Py_DECREF(fast);
    return PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    where[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(fast, i));
    if (!where[i]) {
      free(where);
      Py_DECREF(fast);
      return NULL;
    }
  }
  int rc = WA_EINVAL;
  if (n == self->nranks) rc = wa_describe_ranks(self->e, where);
  free(where);
  Py_DECREF(fast);
  if (rc == WA_EINVAL) {
    PyErr_Format(PyExc_ValueError, "describe_ranks needs one entry per rank (%d), got %zd",
                 self->nranks, n);
    return NULL;
  }
  if (rc != WA_OK) return PyErr_NoMemory();
  Py_RETURN_NONE;
}

/* publish and close: a call with the GIL released (close waits for every rank) -> None. */
static PyObject *none_call(wa_engine *e, int (*call)(wa_engine *)) {
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = call(e);
  Py_END_ALLOW_THREADS
  if (rc != WA_OK) return raise_for(e, rc, NULL);
  Py_RETURN_NONE;
}

static PyObject *Engine_publish(EngineObject *self, PyObject *unused) {
  NEED_ENGINE(self);
  return none_call(self->e, wa_publish);
}

static PyObject *Engine_set_outer(EngineObject *self, PyObject *args) {
  unsigned long long prev_addr, mom_addr;
  double lr, mu;
  NEED_ENGINE(self);
  if (!PyArg_ParseTuple(args, "KKdd", &prev_addr, &mom_addr, &lr, &mu)) return NULL;
  int rc = wa_set_outer(self->e, (float *)(uintptr_t)prev_addr, (float *)(uintptr_t)mom_addr, lr, mu);
  if (rc != WA_OK) return raise_for(self->e, rc, NULL);
  Py_RETURN_NONE;
}

static PyObject *Engine_set_global_precision(EngineObject *self, PyObject *args) {
  int precision;
  unsigned long long base_addr;
  NEED_ENGINE(self);
  if (!PyArg_ParseTuple(args, "iK", &precision, &base_addr)) return NULL;
  int rc = wa_set_global_precision(self->e, precision, (float *)(uintptr_t)base_addr);
  if (rc != WA_OK) return raise_for(self->e, rc, NULL);
  Py_RETURN_NONE;
}

static PyObject *Engine_set_nonfinite_guard(EngineObject *self, PyObject *on) {
  NEED_ENGINE(self);
  int flag = PyObject_IsTrue(on);
  if (flag < 0) return NULL;
  int rc = wa_set_nonfinite_guard(self->e, flag);
  if (rc != WA_OK) return raise_for(self->e, rc, NULL);
  Py_RETURN_NONE;
}

static PyObject *Engine_ready(EngineObject *self, PyObject *unused) {
  NEED_ENGINE(self);
  return PyBool_FromLong(wa_ready(self->e));
}

static PyObject *Engine_global_pending(EngineObject *self, PyObject *unused) {
  NEED_ENGINE(self);
  return PyBool_FromLong(wa_global_pending(self->e));
}

static PyObject *Engine_layouts_computed(EngineObject *self, PyObject *unused) {
  NEED_ENGINE(self);
  return PyLong_FromLongLong((long long)wa_layouts_computed(self->e));
}

static PyObject *Engine_wait_began(EngineObject *self, PyObject *arg) {
  NEED_ENGINE(self);
  double t = PyFloat_AsDouble(arg);
  if (t == -1.0 && PyErr_Occurred()) return NULL;
  wa_wait_began(self->e, t);
  Py_RETURN_NONE;
}

static PyObject *Engine_next_iteration(EngineObject *self, PyObject *unused) {
  NEED_ENGINE(self);
  return PyLong_FromLongLong((long long)wa_next_iteration(self->e));
}

static PyObject *Engine_close(EngineObject *self, PyObject *unused) {
  if (!self->e) Py_RETURN_NONE;
  return none_call(self->e, wa_close);
}

static PyMethodDef Engine_methods[] = {
    {"allreduce", (PyCFunction)Engine_allreduce, METH_VARARGS,
     "allreduce(late, reset) -> (iteration, is_global, group, stale, staleness, wait_s, "
     "applied_global, global_lag, nodes)"},
    {"settle", (PyCFunction)Engine_settle, METH_NOARGS,
     "Wait for and apply the outstanding overlapped global average -> the allreduce tuple."},
    {"synchronize", (PyCFunction)Engine_synchronize, METH_NOARGS,
     "settle, then a bitwise-identical average over all ranks (collective) -> the settle tuple."},
    {"publish", (PyCFunction)Engine_publish, METH_NOARGS, "Snapshot buf as the contribution."},
    {"set_outer", (PyCFunction)Engine_set_outer, METH_VARARGS,
     "set_outer(prev_addr, mom_addr, lr, mu): the outer step on applied globals (0, 0: off)."},
    {"describe_ranks", (PyCFunction)Engine_describe_ranks, METH_O,
     "describe_ranks(list of str, one per rank): named in the exit report."},
    {"set_global_precision", (PyCFunction)Engine_set_global_precision, METH_VARARGS,
     "set_global_precision(precision, base_addr): the wire of global iterations (wa.h, "
     "wa_set_global_precision; PRECISION_FP32 with base 0: float32)."},
    {"set_nonfinite_guard", (PyCFunction)Engine_set_nonfinite_guard, METH_O,
     "set_nonfinite_guard(on): False turns the non-finite guard off, on every rank alike, only "
     "to measure its cost (wa.h, wa_set_nonfinite_guard)."},
    {"ready", (PyCFunction)Engine_ready, METH_NOARGS,
     "True when the next iteration already completed on this rank's behalf."},
    {"global_pending", (PyCFunction)Engine_global_pending, METH_NOARGS,
     "True while the outstanding overlapped global average waits for a rank's global call."},
    {"layouts_computed", (PyCFunction)Engine_layouts_computed, METH_NOARGS,
     "Node layouts of member sets computed so far (a statistic for tests: once per set)."},
    {"wait_began", (PyCFunction)Engine_wait_began, METH_O,
     "wait_began(t): the next call's timeout counts from t (time.monotonic() seconds)."},
    {"next_iteration", (PyCFunction)Engine_next_iteration, METH_NOARGS,
     "Index of the next iteration."},
    {"close", (PyCFunction)Engine_close, METH_NOARGS, "Collective shutdown."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "native_coll._native.Engine",
    .tp_basicsize = sizeof(EngineObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Low-level wait-avoiding allreduce engine (see native_coll.WaitAvoidingAllreduce).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_methods = Engine_methods,
};

static PyObject *mod_group_of(PyObject *m, PyObject *args) {
  int P, S, rank;
  long long t;
  if (!PyArg_ParseTuple(args, "iiLi", &P, &S, &t, &rank)) return NULL;
  if (P < 1 || rank < 0 || rank >= P || t < 0) {
    PyErr_Format(PyExc_ValueError, "group_of needs P >= 1, 0 <= rank < P and t >= 0 "
                 "(got P=%d, rank=%d, t=%lld)", P, rank, t);
    return NULL;
  }
  int *out = PyMem_Malloc(sizeof(int) * (size_t)P);
  if (!out) return PyErr_NoMemory();
  int n = wa_group_of(P, S, (int64_t)t, rank, out);
  PyObject *res = int_tuple(out, n);
  PyMem_Free(out);
  return res;
}

/* round16(buf) in place, decoded back to float32: the engine's own 16-bit rounding, for tests. */
static PyObject *mod_wire_round(PyObject *m, PyObject *args) {
  int precision;
  Py_buffer view;
  if (!PyArg_ParseTuple(args, "iw*", &precision, &view)) return NULL;
  if (precision != WA_PRECISION_BF16 && precision != WA_PRECISION_FP16) {
    PyBuffer_Release(&view);
    PyErr_Format(PyExc_ValueError, "wire_round: precision must be PRECISION_BF16 or "
                 "PRECISION_FP16, got %d", precision);
    return NULL;
  }
  if (view.len % (Py_ssize_t)sizeof(float) != 0) {
    PyBuffer_Release(&view);
    PyErr_SetString(PyExc_ValueError, "wire_round: the buffer must hold float32 values");
    return NULL;
  }
  int bad = wa_wire_round(precision, view.buf, (size_t)view.len / sizeof(float));
  PyBuffer_Release(&view);
  return PyBool_FromLong(bad);
}

static PyObject *mod_library_version(PyObject *m, PyObject *unused) {
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  if (MPI_Get_library_version(v, &len) != MPI_SUCCESS) {
    PyErr_SetString(PyExc_RuntimeError, "native_coll: MPI_Get_library_version failed");
    return NULL;
  }
  return PyUnicode_FromStringAndSize(v, len);
}

/* A thread that ends the process with `code` after `seconds`, whatever it is doing then: armed
 * before an exit whose MPI_Finalize may wait for a process that died (native_coll.faults). A C
 * thread, since Python's own threads and faulthandler stop before MPI_Finalize runs. */
typedef struct {
  double seconds;
  int code;
} exit_watchdog_arg;

static void *exit_watchdog_main(void *p) {
  exit_watchdog_arg a = *(exit_watchdog_arg *)p;
  free(p);
  struct timespec ts = {(time_t)a.seconds, (long)((a.seconds - (double)(time_t)a.seconds) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
  fflush(NULL);
  _exit(a.code);
  return NULL;
}

static PyObject *mod_exit_watchdog(PyObject *m, PyObject *args) {
  double seconds;
  int code;
  if (!PyArg_ParseTuple(args, "di", &seconds, &code)) return NULL;
  if (!(seconds > 0)) {
    PyErr_SetString(PyExc_ValueError, "exit_watchdog: seconds must be > 0");
    return NULL;
  }
  exit_watchdog_arg *a = malloc(sizeof *a);
  pthread_t th;
  pthread_attr_t attr;
  if (!a) return PyErr_NoMemory();
  a->seconds = seconds;
  a->code = code;
  if (pthread_attr_init(&attr) != 0 ||
      pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) != 0 ||
      pthread_create(&th, &attr, exit_watchdog_main, a) != 0) {
    free(a);
    PyErr_SetString(PyExc_RuntimeError, "exit_watchdog: could not start its thread");
    return NULL;
  }
  pthread_attr_destroy(&attr);
  Py_RETURN_NONE;
}

static PyObject *mod_set_error_classes(PyObject *m, PyObject *args) {
  PyObject *timeout, *nonfinite;
  if (!PyArg_ParseTuple(args, "OO", &timeout, &nonfinite)) return NULL;
  Py_INCREF(timeout);
  Py_XSETREF(timeout_error_cls, timeout);
  Py_INCREF(nonfinite);
  Py_XSETREF(nonfinite_error_cls, nonfinite);
  Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"group_of", mod_group_of, METH_VARARGS, "group_of(P, S, t, rank) -> tuple of ranks"},
    {"wire_round", mod_wire_round, METH_VARARGS,
     "wire_round(precision, float32 buffer): round it in place to the global wire's 16 bits and "
     "back (the engine's own conversion, for tests); True when a value is then NaN or inf."},
    {"library_version", mod_library_version, METH_NOARGS,
     "MPI_Get_library_version of the MPI this module is linked with."},
    {"exit_watchdog", mod_exit_watchdog, METH_VARARGS,
     "exit_watchdog(seconds, code): end the process with _exit(code) after seconds (a C thread)."},
    {"set_error_classes", mod_set_error_classes, METH_VARARGS,
     "set_error_classes(timeout, nonfinite): the exception classes raised on timeouts (with "
     "message, ranks) and on refused non-finite results (with message, iteration, own)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_native",
                                       "native_coll's engine (C over MPI).", -1, module_methods,
                                       NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
  if (PyType_Ready(&EngineType) < 0) return NULL;
  PyObject *m = PyModule_Create(&moduledef);
  if (!m) return NULL;
  Py_INCREF(&EngineType);
  if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
    Py_DECREF(&EngineType);
    Py_DECREF(m);
    return NULL;
  }
  if (PyModule_AddIntConstant(m, "LATE_MERGE", WA_LATE_MERGE) < 0 ||
      PyModule_AddIntConstant(m, "LATE_DISCARD", WA_LATE_DISCARD) < 0 ||
      PyModule_AddIntConstant(m, "LATE_APPLY", WA_LATE_APPLY) < 0 ||
      PyModule_AddIntConstant(m, "GLOBAL_BLOCKING", WA_GLOBAL_BLOCKING) < 0 ||
      PyModule_AddIntConstant(m, "GLOBAL_OVERLAP", WA_GLOBAL_OVERLAP) < 0 ||
      PyModule_AddIntConstant(m, "PRECISION_FP32", WA_PRECISION_FP32) < 0 ||
      PyModule_AddIntConstant(m, "PRECISION_BF16", WA_PRECISION_BF16) < 0 ||
      PyModule_AddIntConstant(m, "PRECISION_FP16", WA_PRECISION_FP16) < 0 ||
      PyModule_AddIntConstant(m, "HAVE_ULFM", wa_have_ulfm()) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
