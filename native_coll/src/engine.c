/* The engine object: the application-facing calls (wa_*), what happens when a collective is
 * activated or finishes, and the poll callback (engine_poll) that the generic progress thread
 * (progress.c) calls with e->mu held; every piece of engine state is guarded by e->mu.
 *
 * struct wa_engine is defined here and nowhere else: the schedule (schedule.c) gets the wire it
 * needs, the progress thread and the exit report get one callback each. Internal functions report
 * a failure by return code and an error slot (wai_err); engine_break is the one place a failure
 * makes the engine unusable. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wa_internal.h"

enum { REQ_ALLREDUCE = 1, REQ_CLOSE = 2, REQ_SETTLE = 3 };

/* An application call handed to the progress thread (lives on the calling thread's stack). */
typedef struct wa_req {
  int kind;
  int64_t t;
  int late; /* WA_LATE_* */
  int reset;
  int taken;
  int done;
  int status;
  int64_t applied_global; /* WA_GLOBAL_OVERLAP: the global average this call applied, else -1 */
  int64_t global_lag;
} wa_req;

struct wa_engine {
  wai_wire wire; /* comm, rank, n, tag window, pool: what the schedule is given */
  int P, S;
  int64_t tau;
  int global_mode; /* WA_GLOBAL_* */
  double timeout;
  float *buf;
  wa_pool pool;

  pthread_mutex_t mu;
  pthread_cond_t wake; /* engine thread sleeps here */
  pthread_cond_t done; /* application thread waits here */
  wai_progress progress;
  int closing, closed;
  int broken;             /* the first failure's WA_E* code (engine_break); 0 while usable */
  char err[512];
  int failed_peer;        /* the peer of the MPI call that broke the engine (-1: MPI did not say) */
  char **where;           /* per rank "host H, pid P" (wa_describe_ranks), for messages */
  wai_exit_entry exit_entry;

  wa_msg ctrl_in;
  MPI_Request ctrl_req;
  wa_msg fin_msg;
  MPI_Request *fin_rq;
  unsigned char *fin_from;
  int fins;

  wa_buf *published;
  int64_t published_version;

  wa_coll *active;  /* collectives created and not yet complete */
  wa_coll *pending; /* completed on this rank's behalf; the application has not called yet */
  /* WA_GLOBAL_OVERLAP: the global this rank contributed to whose average it has not applied yet.
   * While running it is also on `active`; once complete it is on neither list (done = 1). Its
   * contrib_snap is the snapshot U. */
  wa_coll *outstanding;
  int outstanding_done;
  /* WA_GLOBAL_OVERLAP: the outer step (wa_set_outer) applied to A before the APPLY rule; the
   * arrays belong to the caller. NULL: A is applied as it is. */
  float *outer_prev, *outer_mom;
  float outer_mu, outer_keep, outer_push; /* mu, 1 - lr, lr * mu (rounded once, as the caller) */

  int64_t next_t;
  wa_req *req;
  int busy;

  int *scratch; /* P ints for group computation */
  int *info_group, *info_stale, *failed;
  int n_failed;
  wa_info last; /* what the last completed call did; arrays point into info_group/info_stale */
};

/* The one place the engine becomes unusable. The first failure is kept (later ones are its
 * consequences) and the application thread waiting in a call is woken to report it. */
static void engine_break(wa_engine *e, const wai_err *err) {
  if (e->broken) return;
  snprintf(e->err, sizeof e->err, "%s", err->msg);
  e->broken = err->code;
  e->failed_peer = err->peer;
  pthread_cond_broadcast(&e->done);
}

static int is_global(const wa_engine *e, int64_t t) { return (t + 1) % e->tau == 0; }

static wa_coll *find(wa_coll *list, int64_t t) {
  for (wa_coll *c = list; c; c = c->next)
    if (c->t == t) return c;
  return NULL;
}

static void unlink_coll(wa_coll **list, wa_coll *c) {
  for (wa_coll **p = list; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      c->next = NULL;
      return;
    }
}

static void push(wa_coll **list, wa_coll *c) {
  c->next = *list;
  *list = c;
}

/* A new idle collective for iteration t on the active list: all ranks for a global, else the
 * group rule's members (wa.h). */
static int new_active(wa_engine *e, int64_t t, wa_coll **out, wai_err *err) {
  int global = is_global(e, t), S;
  if (global) {
    S = e->P;
    for (int i = 0; i < e->P; i++) e->scratch[i] = i;
  } else {
    S = wa_group_of(e->P, e->S, t, e->wire.rank, e->scratch);
  }
  int rc = wai_coll_new(&e->wire, t, global, e->scratch, S, out, err);
  if (rc == WA_OK) push(&e->active, *out);
  return rc;
}

/* Hand iteration c->t's result to the waiting application call r (mu held, r's thread blocked in
 * wa_allreduce, so writing e->buf is allowed). */
static int deliver(wa_engine *e, wa_coll *c, wa_req *r, wai_err *err) {
  const int me = c->me, S = c->S;
  wa_buf *x;
  if (c->fresh[me] || r->late == WA_LATE_DISCARD) {
    x = wai_buf_ref(c->result);
  } else {
    /* Late: MERGE replaces the stale contribution the group used by the fresh one; APPLY adds
     * all of the progress made since that contribution. */
    x = wai_pool_get(&e->pool);
    if (!x) return wai_err_set(err, WA_ENOMEM, -1, "out of memory for a late member's result");
    const float *restrict R = c->result->data, *restrict U = c->contrib, *restrict W = e->buf;
    float *restrict X = x->data;
    if (r->late == WA_LATE_APPLY) {
      for (size_t i = 0; i < e->wire.n; i++) X[i] = R[i] + (W[i] - U[i]);
    } else {
      const float fs = (float)S;
      for (size_t i = 0; i < e->wire.n; i++) X[i] = R[i] + (W[i] - U[i]) / fs;
    }
  }
  memcpy(e->buf, x->data, e->wire.n * sizeof(float));
  wai_buf_unref(&e->pool, e->published);
  if (r->reset) {
    wai_buf_unref(&e->pool, x);
    x = wai_pool_get(&e->pool);
    if (!x) {
      e->published = NULL;
      return wai_err_set(err, WA_ENOMEM, -1, "out of memory for a zero contribution");
    }
    memset(x->data, 0, e->wire.n * sizeof(float));
  }
  e->published = x;
  e->published_version = c->t + 1;

  int ns = 0;
  int64_t staleness = 0;
  for (int j = 0; j < S; j++) {
    e->info_group[j] = c->members[j];
    if (!c->fresh[j]) {
      e->info_stale[ns++] = c->members[j];
      int64_t behind = c->t - c->version[j] + 1;
      if (behind > staleness) staleness = behind;
    }
  }
  e->last.iteration = c->t;
  e->last.is_global = c->is_global;
  e->last.group = e->info_group;
  e->last.group_len = S;
  e->last.stale = e->info_stale;
  e->last.stale_len = ns;
  e->last.staleness = staleness;
  r->status = WA_OK;
  r->done = 1;
  pthread_cond_broadcast(&e->done);
  return WA_OK;
}

/* Deliver c to r and free it (c is on no list any more). */
static int deliver_and_free(wa_engine *e, wa_coll *c, wa_req *r, wai_err *err) {
  int rc = deliver(e, c, r, err);
  wai_coll_free(&e->wire, c);
  return rc;
}

/* A collective finished: deliver it, or keep it pending until the application calls. */
static int complete(wa_engine *e, wa_coll *c, wai_err *err) {
  unlink_coll(&e->active, c);
  if (c == e->outstanding) {
    /* An overlapped global: its average waits for the application's next call (apply_outstanding). */
    wai_buf_unref(&e->pool, c->gather);
    c->gather = NULL;
    e->outstanding_done = 1;
    return WA_OK;
  }
  if (c->app) return deliver_and_free(e, c, c->app, err);
  /* Completed on this rank's behalf: keep the result (and the contribution it used, for the late
   * merge) until the application calls. The scratch space can go now. */
  wai_buf_unref(&e->pool, c->gather);
  c->gather = NULL;
  push(&e->pending, c);
  return WA_OK;
}

/* Fill e->last with what global iteration c did (every member fresh: globals have no stand-ins). */
static void describe_global(wa_engine *e, const wa_coll *c) {
  for (int j = 0; j < c->S; j++) e->info_group[j] = c->members[j];
  e->last.iteration = c->t;
  e->last.is_global = 1;
  e->last.group = e->info_group;
  e->last.group_len = c->S;
  e->last.stale = e->info_stale;
  e->last.stale_len = 0;
  e->last.staleness = 0;
}

/* Apply the completed overlapped global to buf with the APPLY rule, buf = A + (buf - U) (mu held,
 * the application thread blocked in the call r, so writing buf is allowed). */
static void apply_outstanding(wa_engine *e, wa_req *r) {
  wa_coll *c = e->outstanding;
  const float *restrict A = c->result->data, *restrict U = c->contrib;
  float *restrict W = e->buf;
  if (e->outer_prev) {
    /* The outer step (wa.h, wa_set_outer), element by element in float32 in the documented order,
     * so identical prev, mom and A give a bitwise identical T on every rank. */
    float *restrict prev = e->outer_prev, *restrict mom = e->outer_mom;
    const float mu = e->outer_mu, keep = e->outer_keep, push = e->outer_push;
    for (size_t i = 0; i < e->wire.n; i++) {
      const float d = prev[i] - A[i];
      const float m = mu * mom[i] + d;
      const float t = A[i] + (keep * d - push * m);
      mom[i] = m;
      prev[i] = t;
      W[i] = t + (W[i] - U[i]);
    }
  } else {
    for (size_t i = 0; i < e->wire.n; i++) W[i] = A[i] + (W[i] - U[i]);
  }
  r->applied_global = c->t;
  r->global_lag = e->next_t - c->t;
  if (r->kind == REQ_SETTLE) describe_global(e, c);
  e->outstanding = NULL;
  e->outstanding_done = 0;
  wai_coll_free(&e->wire, c);
}

/* WA_GLOBAL_OVERLAP: contribute a snapshot of buf to global iteration r->t and let the call return
 * at once; the average completes in the background and is applied by a later call. */
static int start_overlapped_global(wa_engine *e, wa_req *r, wai_err *err) {
  /* Globals are never started on a rank's behalf, so c is absent or idle (peers' ACTs). */
  wa_coll *c = find(e->active, r->t);
  int rc;
  if (!c && (rc = new_active(e, r->t, &c, err)) != WA_OK) return rc;
  wa_buf *snap = wai_pool_get(&e->pool);
  wa_buf *pub = !snap ? NULL : r->reset ? wai_pool_get(&e->pool) : wai_buf_ref(snap);
  if (!pub) {
    wai_buf_unref(&e->pool, snap);
    wai_buf_unref(&e->pool, pub);
    return wai_err_set(err, WA_ENOMEM, -1, "out of memory for a global snapshot");
  }
  memcpy(snap->data, e->buf, e->wire.n * sizeof(float));
  if (r->reset) memset(pub->data, 0, e->wire.n * sizeof(float));
  e->outstanding = c;
  e->outstanding_done = 0;
  if ((rc = wai_coll_start(&e->wire, c, snap->data, snap, 1, r->t, err)) != WA_OK) {
    wai_buf_unref(&e->pool, pub);
    return rc;
  }
  /* The snapshot is also what stands in for this rank in group iterations run on its behalf
   * until its next call: the model it continued from, as after a blocking call. */
  wai_buf_unref(&e->pool, e->published);
  e->published = pub;
  e->published_version = r->t + 1;
  describe_global(e, c);
  r->status = WA_OK;
  r->done = 1;
  pthread_cond_broadcast(&e->done);
  return WA_OK;
}

/* Take the application's request, if there is one the engine can act on now (*progressed = 1). */
static int take_request(wa_engine *e, int *progressed, wai_err *err) {
  wa_req *r = e->req;
  if (!r || r->taken) return WA_OK;
  if (r->kind == REQ_CLOSE) {
    r->taken = 1;
    *progressed = 1;
    e->fin_msg = (wa_msg){.kind = MSG_FIN, .t = e->next_t};
    for (int j = 0; j < e->P; j++) {
      if (j == e->wire.rank) continue;
      if (MPI_Isend(&e->fin_msg, WAI_MSG_WORDS, MPI_INT64_T, j, WAI_TAG_CTRL, e->wire.comm,
                    &e->fin_rq[j]) != MPI_SUCCESS)
        return wai_err_set(err, WA_EMPI, j, "MPI_Isend of the close notice to rank %d failed", j);
    }
    e->closing = 1;
    return WA_OK;
  }
  if (e->outstanding) {
    if (e->outstanding_done) {
      apply_outstanding(e, r);
    } else if (r->kind == REQ_SETTLE || is_global(e, r->t)) {
      /* The staleness bound (wa.h): the next global, settle and synchronize wait for the
       * outstanding average, i.e. for every rank to have arrived at it. Not taken: retried on
       * every pass of the progress loop. */
      return WA_OK;
    }
  }
  r->taken = 1;
  *progressed = 1;
  if (r->kind == REQ_SETTLE) {
    r->status = WA_OK;
    r->done = 1;
    pthread_cond_broadcast(&e->done);
    return WA_OK;
  }
  if (e->global_mode == WA_GLOBAL_OVERLAP && is_global(e, r->t))
    return start_overlapped_global(e, r, err);
  wa_coll *c = find(e->pending, r->t);
  if (c) {
    unlink_coll(&e->pending, c);
    return deliver_and_free(e, c, r, err);
  }
  c = find(e->active, r->t);
  if (c && c->stage != STAGE_IDLE) {
    c->app = r; /* started on our behalf with the published snapshot: finish it as a late member */
    return WA_OK;
  }
  int rc;
  if (!c && (rc = new_active(e, r->t, &c, err)) != WA_OK) return rc;
  c->app = r;
  return wai_coll_start(&e->wire, c, e->buf, NULL, 1, r->t, err);
}

/* A peer's ACT for iteration msg->t: the first one makes this rank take part. A message that
 * breaks the protocol is WA_EBROKEN, not WA_EMPI: no connection failed, so no peer is named. */
static int on_act(wa_engine *e, int src, const wa_msg *msg, wai_err *err) {
  int64_t t = msg->t;
  wa_coll *c = find(e->active, t);
  if (!c) {
    if (t < e->next_t || find(e->pending, t))
      return wai_err_set(err, WA_EBROKEN, -1, "protocol error: rank %d activated iteration %lld, "
                         "which rank %d already finished", src, (long long)t, e->wire.rank);
    int rc = new_active(e, t, &c, err);
    if (rc != WA_OK) return rc;
  }
  int j = wai_coll_member_index(c, src);
  if (j < 0 || c->act_from[j])
    return wai_err_set(err, WA_EBROKEN, -1, "protocol error: rank %d activated iteration %lld but is "
                       "not in rank %d's group (do all ranks pass the same group_size and "
                       "sync_period?)", src, (long long)t, e->wire.rank);
  c->act_from[j] = 1;
  c->acts++;
  c->fresh[j] = (unsigned char)msg->fresh;
  c->version[j] = msg->version;
  if (c->stage == STAGE_IDLE && !c->is_global) {
    /* The application has not called for t: take part with the last published contribution. */
    return wai_coll_start(&e->wire, c, e->published->data, wai_buf_ref(e->published), 0,
                          e->published_version, err);
  }
  return WA_OK;
}

/* ------------------------------------------------------------------------------------------ */

static int cond_init_monotonic(pthread_cond_t *cv) {
  pthread_condattr_t a;
  if (pthread_condattr_init(&a) != 0) return -1;
  int rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  if (rc == 0) rc = pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
  return rc;
}

static void to_timespec(double t, struct timespec *ts) {
  ts->tv_sec = (time_t)t;
  ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

/* ---- the progress thread's work ---- */
static int poll_control(wa_engine *e, int *progressed, wai_err *err) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    WAI_CHECK_MPI(err, -1, MPI_Test(&e->ctrl_req, &flag, &st));
    if (!flag) return WA_OK;
    *progressed = 1;
    wa_msg msg = e->ctrl_in; /* the receive is re-posted into ctrl_in at once */
    WAI_CHECK_MPI(err, -1, MPI_Irecv(&e->ctrl_in, WAI_MSG_WORDS, MPI_INT64_T, MPI_ANY_SOURCE,
                                     WAI_TAG_CTRL, e->wire.comm, &e->ctrl_req));
    if (msg.kind == MSG_ACT) {
      int rc = on_act(e, st.MPI_SOURCE, &msg, err);
      if (rc != WA_OK) return rc;
    } else if (msg.kind == MSG_FIN && !e->fin_from[st.MPI_SOURCE]) {
      e->fin_from[st.MPI_SOURCE] = 1;
      e->fins++;
    }
  }
}

static int advance_all(wa_engine *e, int *progressed, size_t *inflight, wai_err *err) {
  *inflight = 0;
  for (wa_coll *c = e->active, *next; c; c = next) {
    next = c->next;
    if (c->stage == STAGE_DATA || c->stage == STAGE_RESULT) {
      int rc = wai_coll_advance(&e->wire, c, progressed, err);
      if (rc != WA_OK) return rc;
    }
    if (c->stage == STAGE_DONE) {
      int rc = complete(e, c, err);
      if (rc != WA_OK) return rc;
      *progressed = 1;
    } else if (c->stage != STAGE_IDLE) {
      *inflight += wai_coll_bytes(&e->wire, c);
    }
  }
  return WA_OK;
}

/* Close completes once every rank has announced its close (so nobody will activate a collective
 * involving us again) and every started collective has finished. */
static int close_ready(wa_engine *e, int *ready, wai_err *err) {
  *ready = 0;
  if (e->fins < e->P - 1) return WA_OK;
  for (wa_coll *c = e->active; c; c = c->next)
    if (c->stage != STAGE_IDLE) return WA_OK;
  int flag = 0;
  if (MPI_Testall(e->P, e->fin_rq, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
    return wai_err_set(err, WA_EMPI, -1, "MPI_Testall on close notices failed");
  if (!flag) return WA_OK;
  /* Nothing can arrive on the control tag any more: every peer's last message was its FIN. */
  WAI_CHECK_MPI(err, -1, MPI_Cancel(&e->ctrl_req));
  WAI_CHECK_MPI(err, -1, MPI_Wait(&e->ctrl_req, MPI_STATUS_IGNORE));
  *ready = 1;
  return WA_OK;
}

/* The progress thread's poll callback (progress.c), mu held: the application's request, the
 * peers' control messages, every collective under way, and the end of a close. */
static int engine_poll(void *ctx, size_t *inflight) {
  wa_engine *e = ctx;
  *inflight = 0;
  if (e->broken) return WAI_POLL_IDLE; /* MPI state is unknown: stay quiet until stopped */
  wai_err err;
  int progressed = 0, ready = 0;
  int rc = take_request(e, &progressed, &err);
  if (rc == WA_OK) rc = poll_control(e, &progressed, &err);
  if (rc == WA_OK) rc = advance_all(e, &progressed, inflight, &err);
  if (rc == WA_OK && e->closing) rc = close_ready(e, &ready, &err);
  if (rc != WA_OK) {
    engine_break(e, &err); /* wakes the application thread, which reports it */
    return WAI_POLL_IDLE;
  }
  if (ready) {
    e->req->status = WA_OK;
    e->req->done = 1;
    pthread_cond_broadcast(&e->done);
    return WAI_POLL_FINISHED;
  }
  return progressed ? WAI_POLL_PROGRESSED : WAI_POLL_IDLE;
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
    if (n > 0)
      wai_exit_report_line(e->wire.rank, (const char *const *)e->where, c->is_global, c->t,
                           missing, n);
    free(missing);
  }
}

int wa_create(MPI_Comm comm, float *buf, size_t n, int group_size, int64_t sync_period,
              int64_t start_iteration, int global_mode, double timeout_s, wa_engine **out,
              char *err, size_t errlen) {
  *out = NULL;
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
  wa_engine *e = calloc(1, sizeof *e);
  if (!e) {
    snprintf(err, errlen, "out of memory");
    return WA_ENOMEM;
  }
  e->buf = buf;
  e->wire.n = n;
  e->wire.pool = &e->pool;
  e->S = group_size;
  e->tau = sync_period;
  e->global_mode = global_mode;
  e->timeout = timeout_s;
  e->ctrl_req = MPI_REQUEST_NULL;
  e->failed_peer = -1;
  /* The duplicate is collective: bounded by the timeout like every other wait of the engine. */
  MPI_Request dup_req = MPI_REQUEST_NULL;
  int rc = MPI_Comm_idup(comm, &e->wire.comm, &dup_req);
  double deadline = wai_now() + timeout_s, pause = 20e-6;
  for (int dup_done = 0; rc == MPI_SUCCESS && !dup_done;) {
    rc = MPI_Test(&dup_req, &dup_done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || dup_done) break;
    if (wai_now() > deadline) {
      /* The request cannot be cancelled (collective); leak it and the engine's memory. */
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
    free(e);
    return WA_EMPI;
  }
  int *tag_ub = NULL, flag = 0;
  if (MPI_Comm_set_errhandler(e->wire.comm, MPI_ERRORS_RETURN) != MPI_SUCCESS ||
      MPI_Comm_rank(e->wire.comm, &e->wire.rank) != MPI_SUCCESS ||
      MPI_Comm_size(e->wire.comm, &e->P) != MPI_SUCCESS ||
      MPI_Comm_get_attr(e->wire.comm, MPI_TAG_UB, &tag_ub, &flag) != MPI_SUCCESS) {
    snprintf(err, errlen, "could not set up the engine's communicator");
    (void)MPI_Comm_free(&e->wire.comm); /* already failing: nothing more to report */
    free(e);
    return WA_EMPI;
  }
  e->wire.tag_window = ((flag ? *tag_ub : 32767) - 2) / 2;

  int P = e->P;
  /* Pool buffers also hold the gather slots: S pieces of ceil(n / S) floats <= n + S. */
  int max_free = (int)(sync_period < 32 ? 2 * sync_period + 8 : 72);
  e->scratch = malloc(sizeof(int) * (size_t)P);
  e->info_group = malloc(sizeof(int) * (size_t)P);
  e->info_stale = malloc(sizeof(int) * (size_t)P);
  e->failed = malloc(sizeof(int) * (size_t)P);
  e->fin_rq = malloc(sizeof(MPI_Request) * (size_t)P);
  e->fin_from = calloc((size_t)P, 1);
  if (!e->scratch || !e->info_group || !e->info_stale || !e->failed || !e->fin_rq ||
      !e->fin_from || wai_pool_init(&e->pool, n + (size_t)P + 1, max_free) != WA_OK) {
    snprintf(err, errlen, "out of memory");
    wa_destroy(e);
    return WA_ENOMEM;
  }
  for (int i = 0; i < P; i++) e->fin_rq[i] = MPI_REQUEST_NULL;
  e->published = wai_pool_get(&e->pool);
  if (pthread_mutex_init(&e->mu, NULL) != 0 || cond_init_monotonic(&e->wake) != 0 ||
      cond_init_monotonic(&e->done) != 0 || !e->published) {
    snprintf(err, errlen, "out of memory");
    wa_destroy(e);
    return WA_ENOMEM;
  }
  memcpy(e->published->data, buf, n * sizeof(float));
  e->next_t = start_iteration;
  e->published_version = start_iteration;
  if (MPI_Irecv(&e->ctrl_in, WAI_MSG_WORDS, MPI_INT64_T, MPI_ANY_SOURCE, WAI_TAG_CTRL, e->wire.comm,
                &e->ctrl_req) !=
          MPI_SUCCESS ||
      wai_progress_start(&e->progress, &e->mu, &e->wake, engine_poll, e) != WA_OK) {
    snprintf(err, errlen, "could not start the progress engine");
    wa_destroy(e);
    return WA_EMPI;
  }
  e->exit_entry = (wai_exit_entry){.report = exit_report, .ctx = e};
  wai_exit_report_register(&e->exit_entry);
  *out = e;
  return WA_OK;
}

/* Post a request to the progress thread and wait for it (mu held). Returns 1 when it finished,
 * 0 when the deadline passed first. */
static int post_and_wait(wa_engine *e, wa_req *r, double deadline) {
  e->req = r;
  pthread_cond_signal(&e->wake);
  struct timespec ts;
  to_timespec(deadline, &ts);
  while (!r->done && !e->broken) {
    if (pthread_cond_timedwait(&e->done, &e->mu, &ts) == ETIMEDOUT && !r->done) return 0;
  }
  return r->done;
}

static int start_call(wa_engine *e) {
  if (e->closed) {
    snprintf(e->err, sizeof e->err, "the collective was closed");
    return WA_ECLOSED;
  }
  if (e->broken) return WA_EBROKEN;
  if (e->busy) return WA_EBUSY;
  return WA_OK;
}

static void ranks_list(char *s, size_t cap, const int *ranks, int n) {
  size_t used = 0;
  s[0] = '\0';
  for (int i = 0; i < n && used + 16 < cap; i++)
    used += (size_t)snprintf(s + used, cap - used, i ? ", %d" : "%d", ranks[i]);
}

/* Post r and wait for it (mu held, e->busy set); on failure name the members that did not answer. */
static int run_request(wa_engine *e, wa_req *r, double deadline, wa_info *info) {
  int rc;
  if (post_and_wait(e, r, deadline)) {
    if (r->kind == REQ_ALLREDUCE) e->next_t++;
    *info = e->last;
    rc = WA_OK;
  } else {
    /* The collective the call was waiting on: the outstanding overlapped global when the request
     * could not be taken yet (wa.h's bound), else this call's own iteration. */
    wa_coll *c = !r->taken && e->outstanding ? e->outstanding : find(e->active, r->t);
    int64_t ct = c ? c->t : r->t;
    const char *kind = is_global(e, ct) ? "global" : "group";
    if (c && c != e->outstanding) c->app = NULL; /* never deliver into this call's stack frame */
    if (e->broken && e->broken != WA_ETIMEOUT) {
      /* An MPI error in flight (the connection to a peer failed: a killed process, a lost node):
       * name the members that had not delivered, like a timeout does. The peer whose send or
       * receive failed is the one lost; when MPI does not say (a failed test), every member that
       * had not delivered is suspect. */
      if (e->broken != WA_EMPI) c = NULL;
      if (e->failed_peer >= 0) {
        e->failed[0] = e->failed_peer;
        e->n_failed = 1;
      } else {
        e->n_failed = c ? wai_coll_missing(c, e->failed) : 0;
      }
      if (e->n_failed > 0) {
        char who[256], cause[sizeof e->err];
        ranks_list(who, sizeof who, e->failed, e->n_failed);
        snprintf(cause, sizeof cause, "%s", e->err);
        char *cut = strstr(cause, ", error stack");
        if (!cut) cut = strchr(cause, '\n');
        if (cut) *cut = '\0'; /* MPICH's error stack follows */
        snprintf(e->err, sizeof e->err, "%s iteration %lld failed: the connection to rank(s) [%s] "
                 "broke (%s); the collective is now unusable (close it)", kind, (long long)ct, who,
                 cause);
        rc = WA_EPEER;
      } else {
        rc = WA_EBROKEN;
      }
    } else {
      e->n_failed = c ? wai_coll_missing(c, e->failed) : 0;
      char who[256];
      ranks_list(who, sizeof who, e->failed, e->n_failed);
      wai_err err;
      if (e->n_failed > 0)
        wai_err_set(&err, WA_ETIMEOUT, -1, "%s iteration %lld did not complete within %g s: "
                    "rank(s) [%s] did not answer; the collective is now unusable (close it)",
                    kind, (long long)ct, e->timeout, who);
      else /* every message arrived and every send completed: MPI itself made no progress */
        wai_err_set(&err, WA_ETIMEOUT, -1, "%s iteration %lld did not complete within %g s "
                    "although every member answered (the MPI library stopped progressing); the "
                    "collective is now unusable (close it)", kind, (long long)ct, e->timeout);
      engine_break(e, &err);
      rc = WA_ETIMEOUT;
    }
  }
  e->req = NULL;
  info->applied_global = r->applied_global;
  info->global_lag = r->global_lag;
  return rc;
}

int wa_allreduce(wa_engine *e, int late, int reset, wa_info *info) {
  double t0 = wai_now();
  pthread_mutex_lock(&e->mu); /* e->err is shared with the progress thread */
  if (late != WA_LATE_MERGE && late != WA_LATE_DISCARD && late != WA_LATE_APPLY) {
    snprintf(e->err, sizeof e->err, "late must be WA_LATE_MERGE, WA_LATE_DISCARD or WA_LATE_APPLY, "
             "got %d", late);
    pthread_mutex_unlock(&e->mu);
    return WA_EINVAL;
  }
  int rc = start_call(e);
  if (rc != WA_OK) {
    pthread_mutex_unlock(&e->mu);
    return rc;
  }
  e->busy = 1;
  wa_req r = {.kind = REQ_ALLREDUCE, .t = e->next_t, .late = late, .reset = reset,
              .applied_global = -1};
  rc = run_request(e, &r, t0 + e->timeout, info);
  e->busy = 0;
  pthread_mutex_unlock(&e->mu);
  info->wait_s = wai_now() - t0;
  return rc;
}

int wa_set_outer(wa_engine *e, float *prev, float *mom, double lr, double mu) {
  pthread_mutex_lock(&e->mu);
  int rc = WA_OK;
  if (e->global_mode != WA_GLOBAL_OVERLAP) {
    snprintf(e->err, sizeof e->err, "wa_set_outer: only global_mode overlap applies the global "
             "average inside the engine; in blocking mode step the caller's outer optimizer after "
             "the global call");
    rc = WA_EINVAL;
  } else if ((prev == NULL) != (mom == NULL) || (prev && !(lr > 0.0 && mu >= 0.0 && mu < 1.0))) {
    snprintf(e->err, sizeof e->err, "wa_set_outer: prev and mom must both be given (or both NULL), "
             "with lr > 0 and 0 <= mu < 1; got lr=%g mu=%g", lr, mu);
    rc = WA_EINVAL;
  } else if (e->busy) {
    snprintf(e->err, sizeof e->err, "another thread is inside a call on this engine");
    rc = WA_EBUSY;
  } else {
    e->outer_prev = prev;
    e->outer_mom = mom;
    e->outer_mu = (float)mu;
    e->outer_keep = (float)(1.0 - lr);
    e->outer_push = (float)(lr * mu);
  }
  pthread_mutex_unlock(&e->mu);
  return rc;
}

int wa_settle(wa_engine *e, wa_info *info) {
  double t0 = wai_now();
  pthread_mutex_lock(&e->mu);
  int rc = start_call(e);
  if (rc != WA_OK) {
    pthread_mutex_unlock(&e->mu);
    return rc;
  }
  memset(info, 0, sizeof *info);
  info->applied_global = -1;
  info->iteration = -1;
  if (e->outstanding) {
    e->busy = 1;
    wa_req r = {.kind = REQ_SETTLE, .t = e->next_t, .applied_global = -1};
    rc = run_request(e, &r, t0 + e->timeout, info);
    e->busy = 0;
  }
  pthread_mutex_unlock(&e->mu);
  info->wait_s = wai_now() - t0;
  return rc;
}

/* Wait for n requests (application thread, mu not held) until the deadline: 1 done, 0 timed out,
 * -1 an MPI error. */
static int wait_requests(int n, MPI_Request *rq, double deadline) {
  double pause = 20e-6;
  for (;;) {
    int flag = 0;
    if (MPI_Testall(n, rq, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS) return -1;
    if (flag) return 1;
    if (wai_now() > deadline) return 0;
    struct timespec ts = {0, (long)(pause * 1e9)};
    nanosleep(&ts, NULL);
    pause = pause * 2 < 1e-3 ? pause * 2 : 1e-3;
  }
}

int wa_synchronize(wa_engine *e, wa_info *info) {
  double t0 = wai_now();
  int rc = wa_settle(e, info);
  if (rc != WA_OK) return rc;
  pthread_mutex_lock(&e->mu);
  rc = start_call(e);
  if (rc == WA_OK) e->busy = 1;
  pthread_mutex_unlock(&e->mu);
  if (rc != WA_OK) return rc;
  /* Point to point on a tag above the iterations' (schedule.c uses 1 .. 2 * tag_window), so the
   * ranks that did not answer are known: everyone sends to rank 0, which sums in rank order,
   * divides and sends the result back. The progress thread never touches this traffic. */
  const int P = e->P, tag = wai_tag_sync(&e->wire);
  const int nbuf = e->wire.rank == 0 ? P - 1 : 1;
  wa_buf **parts = calloc((size_t)nbuf + 1, sizeof *parts);
  MPI_Request *rq = malloc(sizeof(MPI_Request) * 2 * (size_t)P);
  int *peer = malloc(sizeof(int) * 2 * (size_t)P);
  int nrq = 0, ok = parts && rq && peer;
  for (int i = 0; ok && i < nbuf; i++) ok = (parts[i] = wai_pool_get(&e->pool)) != NULL;
  const int oom = !ok;
  int n = (int)e->wire.n;
  double deadline = t0 + e->timeout;
  int done = 1;
  if (ok && P > 1) {
    if (e->wire.rank == 0) {
      for (int j = 1; j < P && ok; j++) {
        peer[nrq] = j;
        ok = MPI_Irecv(parts[j - 1]->data, n, MPI_FLOAT, j, tag, e->wire.comm, &rq[nrq++]) == MPI_SUCCESS;
      }
      if (ok) done = wait_requests(nrq, rq, deadline);
      if (ok && done == 1) {
        float *restrict W = e->buf;
        for (int j = 1; j < P; j++) {
          const float *restrict X = parts[j - 1]->data;
          for (size_t i = 0; i < e->wire.n; i++) W[i] += X[i];
        }
        const float fp = (float)P;
        for (size_t i = 0; i < e->wire.n; i++) W[i] /= fp;
        nrq = 0;
        for (int j = 1; j < P && ok; j++) {
          peer[nrq] = j;
          ok = MPI_Isend(e->buf, n, MPI_FLOAT, j, tag, e->wire.comm, &rq[nrq++]) == MPI_SUCCESS;
        }
        if (ok) done = wait_requests(nrq, rq, deadline);
      }
    } else {
      peer[0] = peer[1] = 0;
      ok = MPI_Irecv(parts[0]->data, n, MPI_FLOAT, 0, tag, e->wire.comm, &rq[nrq++]) == MPI_SUCCESS &&
           MPI_Isend(e->buf, n, MPI_FLOAT, 0, tag, e->wire.comm, &rq[nrq++]) == MPI_SUCCESS;
      if (ok) done = wait_requests(nrq, rq, deadline);
      if (ok && done == 1) memcpy(e->buf, parts[0]->data, e->wire.n * sizeof(float));
    }
  }
  pthread_mutex_lock(&e->mu);
  wai_err err = {.code = WA_OK};
  if (oom) {
    wai_err_set(&err, WA_ENOMEM, -1, "out of memory for synchronize");
  } else if (!ok || done < 0) {
    wai_err_set(&err, WA_EMPI, -1, "synchronize failed: an MPI call on the engine's communicator "
                "failed; the collective is now unusable (close it)");
  } else if (done == 0) {
    /* The unanswered requests stay open: their buffers are leaked with them (error path). */
    e->n_failed = 0;
    for (int i = 0; i < nrq; i++)
      if (rq[i] != MPI_REQUEST_NULL) e->failed[e->n_failed++] = peer[i];
    char who[256];
    ranks_list(who, sizeof who, e->failed, e->n_failed);
    wai_err_set(&err, WA_ETIMEOUT, -1, "synchronize did not complete within %g s: rank(s) [%s] "
                "did not answer; the collective is now unusable (close it)", e->timeout, who);
    parts = NULL;
  } else {
    /* The synchronised model is what this rank continues from: it stands in for it from now. */
    wa_buf *pub = wai_pool_get(&e->pool);
    if (!pub) {
      wai_err_set(&err, WA_ENOMEM, -1, "out of memory for synchronize");
    } else {
      memcpy(pub->data, e->buf, e->wire.n * sizeof(float));
      wai_buf_unref(&e->pool, e->published);
      e->published = pub;
      e->published_version = e->next_t;
    }
  }
  if (err.code != WA_OK) {
    engine_break(e, &err);
    rc = err.code;
  }
  e->busy = 0;
  pthread_mutex_unlock(&e->mu);
  for (int i = 0; parts && i < nbuf; i++) wai_buf_unref(&e->pool, parts[i]);
  free(parts);
  free(rq);
  free(peer);
  info->wait_s = wai_now() - t0;
  return rc;
}

int wa_publish(wa_engine *e) {
  pthread_mutex_lock(&e->mu);
  int rc = start_call(e);
  pthread_mutex_unlock(&e->mu);
  if (rc != WA_OK) return rc;
  /* The copy happens outside the lock: the progress thread never touches buf between calls. */
  wa_buf *snap = wai_pool_get(&e->pool);
  if (!snap) {
    pthread_mutex_lock(&e->mu);
    snprintf(e->err, sizeof e->err, "out of memory for a published snapshot");
    pthread_mutex_unlock(&e->mu);
    return WA_ENOMEM;
  }
  memcpy(snap->data, e->buf, e->wire.n * sizeof(float));
  pthread_mutex_lock(&e->mu);
  wai_buf_unref(&e->pool, e->published);
  e->published = snap;
  e->published_version = e->next_t;
  pthread_mutex_unlock(&e->mu);
  return WA_OK;
}

int wa_ready(wa_engine *e) {
  pthread_mutex_lock(&e->mu);
  /* Started on our behalf counts too: our contribution is already fixed, so fresh work cannot
   * join this iteration any more. */
  wa_coll *c = find(e->active, e->next_t);
  int ready = find(e->pending, e->next_t) != NULL || (c && c->stage != STAGE_IDLE);
  pthread_mutex_unlock(&e->mu);
  return ready;
}

int64_t wa_next_iteration(const wa_engine *e) { return e->next_t; }

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
  if (e->ctrl_req != MPI_REQUEST_NULL) {
    (void)MPI_Cancel(&e->ctrl_req);
    (void)MPI_Request_free(&e->ctrl_req);
  }
  for (int i = 0; e->fin_rq && i < e->P; i++)
    if (e->fin_rq[i] != MPI_REQUEST_NULL) (void)MPI_Request_free(&e->fin_rq[i]);
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
  int ok = post_and_wait(e, &r, wai_now() + e->timeout);
  e->req = NULL;
  int rc = WA_OK;
  if (!ok) {
    e->n_failed = 0;
    for (int j = 0; j < e->P; j++)
      if (j != e->wire.rank && !e->fin_from[j]) e->failed[e->n_failed++] = j;
    char who[256];
    ranks_list(who, sizeof who, e->failed, e->n_failed);
    wai_err err;
    wai_err_set(&err, WA_ETIMEOUT, -1, "close() did not complete within %g s: rank(s) [%s] did "
                "not call close()", e->timeout, who);
    engine_break(e, &err); /* a failure during the close, if any, stays the cause */
    rc = e->broken == WA_ETIMEOUT ? WA_ETIMEOUT : WA_EBROKEN;
  }
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

int wa_failed_ranks(const wa_engine *e, const int **ranks) {
  *ranks = e->failed;
  return e->n_failed;
}
