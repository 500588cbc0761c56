/* The application calls (wa.h) that run one request on the progress thread: each takes e->mu,
 * refuses when the engine is closed, broken or busy, posts its request (activation.c takes it)
 * and waits for it until the engine's timeout, naming the unanswered ranks on failure (failure.c).
 * wa_publish and wa_ready only read or replace the published contribution. */
#include <errno.h>
#include <stdlib.h>
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
  if (e->broken) return WA_EBROKEN;
  if (e->busy) return WA_EBUSY;
  return WA_OK;
}

/* Post r and wait for it (mu held, e->busy set); on failure name the members that did not answer. */
static int run_request(wa_engine *e, wa_req *r, double deadline, wa_info *info) {
  int rc;
  if (wai_post_and_wait(e, r, deadline)) {
    if (r->kind == REQ_ALLREDUCE) e->next_t++;
    *info = e->last;
    rc = WA_OK;
  } else {
    rc = wai_name_request_failure(e, r);
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
    wai_ranks_list(who, sizeof who, e->failed, e->n_failed);
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
    wai_engine_break(e, &err);
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
  wa_coll *c = wai_engine_find(e->active, e->next_t);
  int ready = wai_engine_find(e->pending, e->next_t) != NULL || (c && c->stage != STAGE_IDLE);
  pthread_mutex_unlock(&e->mu);
  return ready;
}

int64_t wa_next_iteration(const wa_engine *e) { return e->next_t; }
