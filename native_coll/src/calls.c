/* The application calls (wa.h) that run one request on the progress thread: each takes e->mu,
 * refuses when the engine is closed, broken or busy, posts its request (activation.c takes it)
 * and waits for it until the engine's timeout, naming the unanswered ranks on failure (failure.c).
 * wa_synchronize is one more such request: its collective has a blocking global's schedule
 * (schedule.c), so no second allreduce exists. wa_publish and wa_ready only read or replace the
 * published contribution; wa_set_nonfinite_guard and wa_set_global_precision only set the
 * wire's settings. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "engine.h"

static void to_timespec(double t, struct timespec *ts) {
  ts->tv_sec = (time_t)t;
  ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

int wai_post_and_wait(wa_engine *e, wa_req *r, double deadline) {
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
  if (e->broken) return wai_name_break(e); /* e->failed names them */
  if (e->busy) return WA_EBUSY;
  return WA_OK;
}

/* Post r and wait for it (mu held, e->busy set); on failure name the members that did not answer. */
static int run_request(wa_engine *e, wa_req *r, double deadline, wa_info *info) {
  int rc;
  if (wai_post_and_wait(e, r, deadline)) {
    if (r->kind == REQ_ALLREDUCE && !r->kept_iteration) e->next_t++;
    *info = e->last;
    rc = r->status; /* WA_OK or WA_ENONFINITE */
  } else {
    rc = wai_name_request_failure(e, r);
  }
  e->req = NULL;
  info->applied_global = r->applied_global;
  info->global_lag = r->global_lag;
  info->nonfinite_own = r->nonfinite_own;
  return rc;
}

/* When this call's wait began (mu held): at the call, `now`, or earlier when the caller had been
 * waiting for it already (wa_wait_began); consumed by the call. */
static double call_t0(wa_engine *e, double now) {
  double t0 = e->call_start > 0 && e->call_start < now ? e->call_start : now;
  e->call_start = 0;
  return t0;
}

int wa_wait_began(wa_engine *e, double t) {
  pthread_mutex_lock(&e->mu);
  e->call_start = t;
  pthread_mutex_unlock(&e->mu);
  return WA_OK;
}

/* Run r as the engine's one call in flight (mu held): refused when the engine is closed, broken
 * or busy, else posted and waited for until t0 + the timeout. */
static int run_call(wa_engine *e, wa_req *r, double t0, wa_info *info) {
  int rc = start_call(e);
  if (rc != WA_OK) return rc;
  e->busy = 1;
  rc = run_request(e, r, t0 + e->timeout, info);
  e->busy = 0;
  return rc;
}

int wa_allreduce(wa_engine *e, int late, int reset, wa_info *info) {
  double t0 = wai_now();
  pthread_mutex_lock(&e->mu); /* e->err is shared with the progress thread */
  t0 = call_t0(e, t0);
  if (late != WA_LATE_MERGE && late != WA_LATE_DISCARD && late != WA_LATE_APPLY) {
    snprintf(e->err, sizeof e->err, "late must be WA_LATE_MERGE, WA_LATE_DISCARD or WA_LATE_APPLY, "
             "got %d", late);
    pthread_mutex_unlock(&e->mu);
    return WA_EINVAL;
  }
  wa_req r = {.kind = REQ_ALLREDUCE, .t = e->next_t, .late = late, .reset = reset,
              .applied_global = -1};
  int rc = run_call(e, &r, t0, info);
  pthread_mutex_unlock(&e->mu);
  info->wait_s = wai_now() - t0;
  return rc;
}

int wa_settle(wa_engine *e, wa_info *info) {
  double t0 = wai_now();
  pthread_mutex_lock(&e->mu);
  t0 = call_t0(e, t0);
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

int wa_synchronize(wa_engine *e, wa_info *info) {
  double t0 = wai_now();
  int rc = wa_settle(e, info);
  if (rc == WA_ENONFINITE) {
    /* The settle dropped a poisoned outstanding global. Not reported here (wa.h): this call's
     * average, over every rank's buf, takes its place, and its own verdict is what it returns. */
    memset(info, 0, sizeof *info);
    info->applied_global = -1;
    info->iteration = -1;
    rc = WA_OK;
  }
  if (rc != WA_OK) return rc;
  /* One collective over every rank with a blocking global's schedule, outside the iteration
   * schedule (engine.h, wai_sync_t); *info keeps what the settle applied. */
  pthread_mutex_lock(&e->mu);
  wa_req r = {.kind = REQ_SYNC, .t = wai_sync_t(e->syncs), .applied_global = -1};
  wa_info unused = {0};
  rc = run_call(e, &r, t0, &unused);
  info->nonfinite_own = unused.nonfinite_own;
  pthread_mutex_unlock(&e->mu);
  info->wait_s = wai_now() - t0;
  return rc;
}

int wa_set_nonfinite_guard(wa_engine *e, int on) {
  pthread_mutex_lock(&e->mu);
  int rc = WA_OK;
  if (e->busy) {
    snprintf(e->err, sizeof e->err, "another thread is inside a call on this engine");
    rc = WA_EBUSY;
  } else {
    e->wire.nonfinite_guard = on != 0; /* the schedule reads it under mu (the progress thread) */
  }
  pthread_mutex_unlock(&e->mu);
  return rc;
}

/* A global iteration that exists on this rank (created by a peer's activation or by this rank's
 * own call, running, completed on its behalf or outstanding) on another wire than `precision`. */
static const wa_coll *global_on_other_wire(const wa_engine *e, int precision) {
  const wa_coll *lists[] = {e->active, e->pending, e->outstanding};
  for (int i = 0; i < 3; i++)
    for (const wa_coll *c = lists[i]; c; c = i == 2 ? NULL : c->next)
      if (c->is_global && c->t >= 0 && c->lowp != precision) return c;
  return NULL;
}

int wa_set_global_precision(wa_engine *e, int precision, float *base) {
  pthread_mutex_lock(&e->mu);
  int rc = WA_EINVAL;
  const wa_coll *early = NULL;
  if (precision != WA_PRECISION_FP32 && precision != WA_PRECISION_BF16 &&
      precision != WA_PRECISION_FP16) {
    snprintf(e->err, sizeof e->err, "wa_set_global_precision: precision must be "
             "WA_PRECISION_FP32, WA_PRECISION_BF16 or WA_PRECISION_FP16, got %d", precision);
  } else if (precision != WA_PRECISION_FP32 && !base) {
    snprintf(e->err, sizeof e->err, "wa_set_global_precision: a 16-bit wire needs the base "
             "(the last global model, n floats, identical on every rank)");
  } else if (e->busy) {
    snprintf(e->err, sizeof e->err, "another thread is inside a call on this engine");
    rc = WA_EBUSY;
  } else if ((early = global_on_other_wire(e, precision)) != NULL) {
    /* Its receives are posted for its own wire already (a peer's activation can create it before
     * this rank's first call): changing the wire under it would mismatch every message. */
    snprintf(e->err, sizeof e->err, "wa_set_global_precision: global iteration %lld already "
             "exists on this rank on the %s wire (activated by a peer, or outstanding): every "
             "rank sets the precision and all agree (e.g. a barrier) before any rank's first "
             "wa_allreduce, and it changes only while no global is outstanding",
             (long long)early->t, early->lowp == WA_PRECISION_FP32 ? "float32"
                                  : early->lowp == WA_PRECISION_BF16 ? "bfloat16" : "float16");
  } else {
    /* The schedule reads both under mu (the progress thread), only inside a global's call. */
    e->wire.global_precision = precision;
    e->global_base = precision == WA_PRECISION_FP32 ? NULL : base;
    e->wire.global_base = e->global_base;
    rc = WA_OK;
  }
  pthread_mutex_unlock(&e->mu);
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
  wa_coll *c = wai_engine_find(e->active, e->next_t);
  int ready = wai_engine_find(e->pending, e->next_t) != NULL || (c && c->stage != STAGE_IDLE);
  pthread_mutex_unlock(&e->mu);
  return ready;
}

int wa_global_pending(wa_engine *e) {
  pthread_mutex_lock(&e->mu);
  int pending = e->outstanding != NULL && !e->outstanding_done;
  pthread_mutex_unlock(&e->mu);
  return pending;
}

int64_t wa_next_iteration(const wa_engine *e) { return e->next_t; }
