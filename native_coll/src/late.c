/* Handing a finished collective's result to the application call waiting for it: on time, the
 * group's (or global's) average R; late, R adjusted by the call's late rule (WA_LATE_MERGE,
 * WA_LATE_DISCARD, WA_LATE_APPLY; wa.h). The result becomes this rank's published contribution
 * (zeros with reset) and e->last describes what the iteration did. */
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
  r->status = WA_OK;
  r->done = 1;
  pthread_cond_broadcast(&e->done);
  return WA_OK;
}

int wai_deliver_and_free(wa_engine *e, wa_coll *c, wa_req *r, wai_err *err) {
  int rc = deliver(e, c, r, err);
  wai_coll_free(&e->wire, c);
  return rc;
}
