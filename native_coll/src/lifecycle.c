/* The engine's lifecycle: wa_create (arguments checked, the private communicator duplicated within
 * the timeout, the progress thread started), the collective wa_close, the local teardown after a
 * failure, wa_destroy, and the engine's exit-report callback (exit_report.c), plus the accessors
 * of what a failure left (wa_last_error, wa_failed_ranks) and wa_describe_ranks. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

static int cond_init_monotonic(pthread_cond_t *cv) {
  pthread_condattr_t a;
  if (pthread_condattr_init(&a) != 0) return -1;
  int rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  if (rc == 0) rc = pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
  return rc;
}

/* The exit report's callback (exit_report.c): no MPI call, no lock (see there). */
static void exit_report(void *ctx) {
  const wa_engine *e = ctx;
  if (e->closed || !e->progress.running) return;
  for (const wa_coll *c = e->active; c; c = c->next) {
    if (c->stage != STAGE_DATA && c->stage != STAGE_RESULT) continue;
    int *missing = malloc(sizeof(int) * (size_t)c->S);
    if (!missing) return;
    int n = wai_coll_missing(c, missing);
    char what[64];
    wai_coll_name(e, c->t, what, sizeof what);
    if (n > 0) wai_exit_report_line(e->wire.rank, (const char *const *)e->where, what, missing, n);
    free(missing);
  }
}

/* Which node every rank is on, for the node-aware schedule (schedule_hier.c): ranks that share
 * memory (MPI_COMM_TYPE_SHARED) share a node. WA_HIERARCHY=off keeps every collective on the direct
 * schedule; WA_NODE_SIZE=k pretends ranks k r .. k r + k - 1 share a node (tests on one machine);
 * WA_HIER_MIN_BYTES (default 256 KiB) is the smallest buffer worth the two extra steps. Every rank
 * runs the same collectives whatever its settings, then the ranks compare them: settings that
 * differ between ranks would give them different schedules, so they are refused on every rank.
 * Called once every rank has joined the engine's communicator; the exchange is bounded by the
 * timeout all the same. */
static long long env_number(const char *name, long long dflt, long long lo, int *bad) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end = NULL;
  long long x = strtoll(v, &end, 10);
  if (*end || x < lo) *bad = 1;
  return x;
}

static int node_map(wa_engine *e, double timeout_s, char *err, size_t errlen) {
  const int P = e->P, rank = e->wire.rank;
  const char *mode = getenv("WA_HIERARCHY");
  int bad = 0;
  long long off = mode && strcmp(mode, "off") == 0;
  if (mode && *mode && !off && strcmp(mode, "auto") != 0) bad = 1;
  long long fake = env_number("WA_NODE_SIZE", 0, 1, &bad);
  long long min_bytes = env_number("WA_HIER_MIN_BYTES", 256 * 1024, 0, &bad);
  MPI_Comm shm = MPI_COMM_NULL;
  int lowest = rank;
  long long mine[5], *all = malloc(sizeof(long long) * 5 * (size_t)P);
  e->node_of = malloc(sizeof(int) * (size_t)P);
  if (!all || !e->node_of) {
    free(all);
    snprintf(err, errlen, "out of memory");
    return WA_ENOMEM;
  }
  if (MPI_Comm_split_type(e->wire.comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shm) !=
          MPI_SUCCESS ||
      MPI_Allreduce(&rank, &lowest, 1, MPI_INT, MPI_MIN, shm) != MPI_SUCCESS ||
      MPI_Comm_free(&shm) != MPI_SUCCESS) {
    free(all);
    snprintf(err, errlen, "could not find which ranks share a node (MPI_COMM_TYPE_SHARED)");
    return WA_EMPI;
  }
  mine[0] = lowest, mine[1] = bad, mine[2] = off, mine[3] = fake, mine[4] = min_bytes;
  MPI_Request rq = MPI_REQUEST_NULL;
  int rc = MPI_Iallgather(mine, 5, MPI_LONG_LONG, all, 5, MPI_LONG_LONG, e->wire.comm, &rq);
  double deadline = wai_now() + timeout_s;
  for (int done = 0; rc == MPI_SUCCESS && !done;) {
    rc = MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS && !done && wai_now() > deadline) {
      snprintf(err, errlen, "the ranks did not exchange their node within %g s", timeout_s);
      return WA_ETIMEOUT; /* the request cannot be cancelled: all is leaked, as for the dup */
    }
    if (rc == MPI_SUCCESS && !done) {
      struct timespec ts = {0, 200000};
      nanosleep(&ts, NULL);
    }
  }
  if (rc != MPI_SUCCESS) {
    free(all);
    snprintf(err, errlen, "could not exchange the ranks' nodes (MPI_Iallgather failed)");
    return WA_EMPI;
  }
  rc = WA_OK;
  for (int r = 0; r < P && rc == WA_OK; r++) {
    const long long *x = all + 5 * r;
    if (x[1]) {
      snprintf(err, errlen, "rank %d: WA_HIERARCHY must be 'auto' or 'off', WA_NODE_SIZE a number "
               "of ranks >= 1 and WA_HIER_MIN_BYTES a number of bytes >= 0 (see "
               "docs/collective.md#node-aware-schedule)", r);
      rc = WA_EINVAL;
    } else if (x[2] != mine[2] || x[3] != mine[3] || x[4] != mine[4]) {
      snprintf(err, errlen, "WA_HIERARCHY, WA_NODE_SIZE or WA_HIER_MIN_BYTES differ between rank "
               "%d and rank %d: set them alike on every rank", rank, r);
      rc = WA_EINVAL;
    }
    e->node_of[r] = fake ? r / (int)fake : (int)x[0];
  }
  free(all);
  if (rc != WA_OK) return rc;
  e->wire.hier_min = (size_t)(min_bytes / (long long)sizeof(float));
  if (!off) e->wire.node_of = e->node_of;
  return WA_OK;
}

/* wa_create's arguments, checked before anything is allocated; size: the communicator's. */
static int check_args(MPI_Comm comm, const float *buf, size_t n, int group_size,
                      int64_t sync_period, int64_t start_iteration, int global_mode,
                      double timeout_s, char *err, size_t errlen) {
  int provided = 0, size = 0;
  if (MPI_Query_thread(&provided) != MPI_SUCCESS || provided < MPI_THREAD_MULTIPLE) {
    snprintf(err, errlen, "MPI was initialised without MPI_THREAD_MULTIPLE; the progress thread "
             "needs it (mpi4py asks for it unless mpi4py.rc.thread_level was changed)");
    return WA_EINVAL;
  }
  if (MPI_Comm_size(comm, &size) != MPI_SUCCESS) {
    snprintf(err, errlen, "the communicator is not valid (MPI_Comm_size failed)");
    return WA_EINVAL;
  }
  if (!buf || n == 0 || n > (size_t)INT_MAX) {
    snprintf(err, errlen, "buffer must hold 1 to %d floats, got %zu", INT_MAX, n);
    return WA_EINVAL;
  }
  if (group_size < 1 || group_size > size) {
    snprintf(err, errlen, "group_size must be between 1 and the number of ranks (%d), got %d",
             size, group_size);
    return WA_EINVAL;
  }
  if (sync_period < 1) {
    snprintf(err, errlen, "sync_period must be >= 1, got %lld", (long long)sync_period);
    return WA_EINVAL;
  }
  if (start_iteration < 0) {
    snprintf(err, errlen, "start_iteration must be >= 0, got %lld", (long long)start_iteration);
    return WA_EINVAL;
  }
  if (!(timeout_s > 0)) {
    snprintf(err, errlen, "timeout must be > 0 seconds, got %g", timeout_s);
    return WA_EINVAL;
  }
  if (global_mode != WA_GLOBAL_BLOCKING && global_mode != WA_GLOBAL_OVERLAP) {
    snprintf(err, errlen, "global_mode must be WA_GLOBAL_BLOCKING or WA_GLOBAL_OVERLAP, got %d",
             global_mode);
    return WA_EINVAL;
  }
  return WA_OK;
}

/* The engine's private duplicate of comm (collective: bounded by the timeout like every other
 * wait of the engine), its rank, size and tag window. On WA_ETIMEOUT the pending duplicate may
 * still write e, which the caller must leak; on any other failure no communicator is left. */
static int dup_comm(wa_engine *e, MPI_Comm comm, double timeout_s, char *err, size_t errlen) {
  MPI_Request dup_req = MPI_REQUEST_NULL;
  int rc = MPI_Comm_idup(comm, &e->wire.comm, &dup_req);
  double deadline = wai_now() + timeout_s, pause = 20e-6;
  for (int dup_done = 0; rc == MPI_SUCCESS && !dup_done;) {
    rc = MPI_Test(&dup_req, &dup_done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || dup_done) break;
    if (wai_now() > deadline) {
      snprintf(err, errlen, "the engine's communicator was not created within %g s: a rank did "
               "not construct the collective", timeout_s);
      return WA_ETIMEOUT;
    }
    struct timespec ts = {0, (long)(pause * 1e9)};
    nanosleep(&ts, NULL);
    pause = pause * 2 < 1e-3 ? pause * 2 : 1e-3;
  }
  if (rc != MPI_SUCCESS) {
    snprintf(err, errlen, "MPI_Comm_idup failed");
    return WA_EMPI;
  }
  int *tag_ub = NULL, flag = 0;
  if (MPI_Comm_set_errhandler(e->wire.comm, MPI_ERRORS_RETURN) != MPI_SUCCESS ||
      MPI_Comm_rank(e->wire.comm, &e->wire.rank) != MPI_SUCCESS ||
      MPI_Comm_size(e->wire.comm, &e->P) != MPI_SUCCESS ||
      MPI_Comm_get_attr(e->wire.comm, MPI_TAG_UB, &tag_ub, &flag) != MPI_SUCCESS) {
    snprintf(err, errlen, "could not set up the engine's communicator");
    (void)MPI_Comm_free(&e->wire.comm); /* already failing: nothing more to report */
    return WA_EMPI;
  }
  e->wire.tag_window = ((flag ? *tag_ub : 32767) - 2) / 2;
  return WA_OK;
}

/* The per-rank arrays, the buffer pool, the published contribution (a copy of buf), the lock and
 * the conditions. On failure the caller destroys e (wa_destroy frees what was allocated). */
static int alloc_state(wa_engine *e, int64_t sync_period, char *err, size_t errlen) {
  const int P = e->P;
  /* Pool buffers also hold the gather slots: S pieces of ceil(n / S) floats <= n + S. */
  int max_free = (int)(sync_period < 32 ? 2 * sync_period + 8 : 72);
  e->scratch = malloc(sizeof(int) * (size_t)P);
  e->info_group = malloc(sizeof(int) * (size_t)P);
  e->info_stale = malloc(sizeof(int) * (size_t)P);
  e->failed = malloc(sizeof(int) * (size_t)P);
  e->fin_rq = malloc(sizeof(MPI_Request) * (size_t)P);
  e->fin_from = calloc((size_t)P, 1);
  if (!e->scratch || !e->info_group || !e->info_stale || !e->failed || !e->fin_rq ||
      !e->fin_from || wai_pool_init(&e->pool, e->wire.n + (size_t)P + 1, max_free) != WA_OK) {
    snprintf(err, errlen, "out of memory");
    return WA_ENOMEM;
  }
  for (int i = 0; i < P; i++) e->fin_rq[i] = MPI_REQUEST_NULL;
  e->published = wai_pool_get(&e->pool);
  if (pthread_mutex_init(&e->mu, NULL) != 0 || cond_init_monotonic(&e->wake) != 0 ||
      cond_init_monotonic(&e->done) != 0 || !e->published) {
    snprintf(err, errlen, "out of memory");
    return WA_ENOMEM;
  }
  memcpy(e->published->data, e->buf, e->wire.n * sizeof(float));
  return WA_OK;
}

int wa_create(MPI_Comm comm, float *buf, size_t n, int group_size, int64_t sync_period,
              int64_t start_iteration, int global_mode, double timeout_s, wa_engine **out,
              char *err, size_t errlen) {
  *out = NULL;
  int rc = check_args(comm, buf, n, group_size, sync_period, start_iteration, global_mode,
                      timeout_s, err, errlen);
  if (rc != WA_OK) return rc;
  wa_engine *e = calloc(1, sizeof *e);
  if (!e) {
    snprintf(err, errlen, "out of memory");
    return WA_ENOMEM;
  }
  e->buf = buf;
  e->wire.n = n;
  e->wire.pool = &e->pool;
  e->wire.layouts = &e->layouts;
  e->wire.nonfinite_guard = 1;
  e->S = group_size;
  e->tau = sync_period;
  e->global_mode = global_mode;
  e->timeout = timeout_s;
  e->ctrl_req = MPI_REQUEST_NULL;
  e->failed_peer = -1;
  e->failed_t = INT64_MIN;
  if ((rc = dup_comm(e, comm, timeout_s, err, errlen)) != WA_OK) {
    if (rc != WA_ETIMEOUT) free(e); /* timed out: the duplicate may still write e, leaked */
    return rc;
  }
  if ((rc = node_map(e, timeout_s, err, errlen)) != WA_OK) {
    (void)MPI_Comm_free(&e->wire.comm); /* already failing: nothing more to report */
    free(e->node_of);
    free(e);
    return rc;
  }
  if ((rc = alloc_state(e, sync_period, err, errlen)) != WA_OK) {
    wa_destroy(e);
    return rc;
  }
  e->next_t = start_iteration;
  e->published_version = start_iteration;
  if (MPI_Irecv(&e->ctrl_in, WAI_MSG_WORDS, MPI_INT64_T, MPI_ANY_SOURCE, WAI_TAG_CTRL, e->wire.comm,
                &e->ctrl_req) !=
          MPI_SUCCESS ||
      wai_progress_start(&e->progress, &e->mu, &e->wake, wai_engine_poll, e) != WA_OK) {
    snprintf(err, errlen, "could not start the progress engine");
    wa_destroy(e);
    return WA_EMPI;
  }
  e->exit_entry = (wai_exit_entry){.report = exit_report, .ctx = e};
  wai_exit_report_register(&e->exit_entry);
  *out = e;
  return WA_OK;
}

/* Non-collective stop: used after a failure and when an engine is destroyed without close. */
static void local_teardown(wa_engine *e) {
  wai_progress_stop(&e->progress);
  for (wa_coll *c = e->active, *next; c; c = next) {
    next = c->next;
    if (c->stage == STAGE_IDLE) wai_coll_free(&e->wire, c);
    else wai_coll_abandon(c);
  }
  e->active = NULL;
  for (wa_coll *c = e->pending, *next; c; c = next) {
    next = c->next;
    wai_coll_free(&e->wire, c);
  }
  e->pending = NULL;
  if (e->outstanding && e->outstanding_done) wai_coll_free(&e->wire, e->outstanding); /* else on active */
  e->outstanding = NULL;
  /* Teardown after a failure or without close: a failing cancel or free could change nothing,
   * so their codes are not reported. */
  if (e->ctrl_req != MPI_REQUEST_NULL) wai_drop_request(&e->ctrl_req, 1);
  for (int i = 0; e->fin_rq && i < e->P; i++)
    if (e->fin_rq[i] != MPI_REQUEST_NULL) wai_drop_request(&e->fin_rq[i], 0);
  e->closed = 1;
}

int wa_close(wa_engine *e) {
  pthread_mutex_lock(&e->mu);
  if (e->closed) {
    pthread_mutex_unlock(&e->mu);
    return WA_OK;
  }
  if (e->busy) {
    pthread_mutex_unlock(&e->mu);
    return WA_EBUSY;
  }
  if (e->broken) {
    pthread_mutex_unlock(&e->mu);
    local_teardown(e);
    return WA_OK; /* the failure itself was reported by the call that hit it */
  }
  wa_req r = {.kind = REQ_CLOSE};
  int ok = wai_post_and_wait(e, &r, wai_now() + e->timeout);
  e->req = NULL;
  int rc = ok ? WA_OK : wai_name_close_failure(e);
  pthread_mutex_unlock(&e->mu);
  if (rc != WA_OK) {
    local_teardown(e);
    return rc;
  }
  wai_progress_stop(&e->progress);
  for (wa_coll *c = e->pending, *next; c; c = next) {
    next = c->next;
    wai_coll_free(&e->wire, c);
  }
  e->pending = NULL;
  for (wa_coll *c = e->active, *next; c; c = next) { /* globals peers announced, never started */
    next = c->next;
    wai_coll_free(&e->wire, c);
  }
  e->active = NULL;
  /* An overlapped global average never applied is dropped (wa_settle before close keeps it). */
  if (e->outstanding) wai_coll_free(&e->wire, e->outstanding);
  e->outstanding = NULL;
  e->closed = 1;
  if (MPI_Comm_free(&e->wire.comm) != MPI_SUCCESS) {
    snprintf(e->err, sizeof e->err, "close: MPI_Comm_free of the engine's communicator failed");
    return WA_EMPI; /* closed all the same: nothing of the engine is in use any more */
  }
  return WA_OK;
}

void wa_destroy(wa_engine *e) {
  if (!e) return;
  wai_exit_report_unregister(&e->exit_entry);
  if (!e->closed && e->progress.running) local_teardown(e);
  if (e->published) wai_buf_unref(&e->pool, e->published);
  if (e->pool.cap) wai_pool_destroy(&e->pool);
  free(e->scratch);
  free(e->info_group);
  free(e->info_stale);
  free(e->failed);
  free(e->fin_rq);
  free(e->fin_from);
  free(e->node_of);
  wai_layout_cache_clear(&e->layouts);
  for (int i = 0; e->where && i < e->P; i++) free(e->where[i]);
  free(e->where);
  free(e);
}

int wa_describe_ranks(wa_engine *e, const char *const *where) {
  char **w = calloc((size_t)e->P, sizeof *w);
  if (!w) return WA_ENOMEM;
  for (int i = 0; i < e->P; i++) {
    w[i] = strdup(where[i] ? where[i] : "");
    if (!w[i]) {
      for (int j = 0; j < i; j++) free(w[j]);
      free(w);
      return WA_ENOMEM;
    }
  }
  pthread_mutex_lock(&e->mu);
  char **old = e->where;
  e->where = w;
  pthread_mutex_unlock(&e->mu);
  for (int i = 0; old && i < e->P; i++) free(old[i]);
  free(old);
  return WA_OK;
}

const char *wa_last_error(const wa_engine *e) { return e->err; }

int64_t wa_layouts_computed(wa_engine *e) {
  pthread_mutex_lock(&e->mu);
  int64_t n = e->layouts.computed;
  pthread_mutex_unlock(&e->mu);
  return n;
}

int wa_failed_ranks(const wa_engine *e, const int **ranks) {
  *ranks = e->failed;
  return e->n_failed;
}
