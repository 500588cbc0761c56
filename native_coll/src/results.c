/* Handing a finished collective's result to the application call waiting for it. An iteration's
 * call gets the group's (or global's) average R on time, and late R adjusted by its late rule
 * (WA_LATE_MERGE, WA_LATE_DISCARD, WA_LATE_APPLY; wa.h); the result becomes this rank's published
 * contribution (zeros with reset) and e->last describes what the iteration did. A synchronize's
 * call gets the average of every rank's buf, published, and leaves e->last alone. */
#include <string.h>

#include "engine.h"

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
  e->last.nodes = c->hier ? c->N : 0;
  wai_request_done(e, r);
  return WA_OK;
}

/* wa_synchronize's collective: every rank took part with its own buf (a global never runs on a
 * rank's behalf), so R is the blocking global's average. It is what this rank continues from, so
 * it stands in for it from now on. Outside the iteration schedule: e->last is left alone. */
static void deliver_sync(wa_engine *e, wa_coll *c, wa_req *r) {
  memcpy(e->buf, c->result->data, e->wire.n * sizeof(float));
  wai_buf_unref(&e->pool, e->published);
  e->published = wai_buf_ref(c->result);
  e->published_version = e->next_t;
  wai_request_done(e, r);
}

int wai_deliver_and_free(wa_engine *e, wa_coll *c, wa_req *r, wai_err *err) {
  int rc = WA_OK;
  if (r->kind == REQ_SYNC) deliver_sync(e, c, r);
  else rc = deliver(e, c, r, err);
  wai_coll_free(&e->wire, c);
  return rc;
}
