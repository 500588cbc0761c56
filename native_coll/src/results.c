/* Handing a finished collective's result to the application call waiting for it. An iteration's
 * call gets the group's (or global's) average R on time, and late R adjusted by its late rule
 * (WA_LATE_MERGE, WA_LATE_DISCARD, WA_LATE_APPLY; wa.h); the result becomes this rank's published
 * contribution (zeros with reset) and e->last describes what the iteration did. A synchronize's
 * call gets the average of every rank's buf, published, and leaves e->last alone. A result holding
 * NaN or inf is refused instead (wai_refuse, WA_ENONFINITE): buf and the published contribution
 * stay as they were. */
#include <string.h>

#include "engine.h"

/* Fill e->last with what iteration c did, as seen by this rank. */
static void describe(wa_engine *e, const wa_coll *c) {
  int ns = 0;
  int64_t staleness = 0;
  for (int j = 0; j < c->S; j++) {
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
  e->last.group_len = c->S;
  e->last.stale = e->info_stale;
  e->last.stale_len = ns;
  e->last.staleness = staleness;
  e->last.nodes = c->N;
  e->last.bytes_sent = c->bytes_sent;
}

void wai_refuse(wa_engine *e, wa_req *r, int64_t t, int own) {
  char what[64];
  wai_coll_name(e, t, what, sizeof what);
  snprintf(e->err, sizeof e->err, "%s was not applied: %s held NaN or inf; buf and the published "
           "contribution are as they were", what,
           own ? "this rank's own data" : "another member's contribution to its average");
  r->nonfinite_own = own;
  wai_request_end(e, r, WA_ENONFINITE);
}

/* A late member's result, X = R + (W - U) (APPLY) or R + (W - U) / S (MERGE); with the guard on,
 * the guard's bits over X (wai_nonfinite_bits). The branches are loop-invariant: the compiler makes
 * a loop of each. */
static uint32_t late_result(float *restrict X, const float *restrict R, const float *restrict U,
                            const float *restrict W, size_t n, int apply, float fs, int guard) {
  uint32_t seen = 0;
  for (size_t i = 0; i < n; i++) {
    X[i] = apply ? R[i] + (W[i] - U[i]) : R[i] + (W[i] - U[i]) / fs;
    if (guard) seen |= wai_nonfinite_bits(X[i]);
  }
  return seen;
}

/* Hand iteration c->t's result to the waiting application call r (mu held, r's thread blocked in
 * wa_allreduce, so writing e->buf is allowed). A poisoned result is refused (wa.h). */
static int deliver(wa_engine *e, wa_coll *c, wa_req *r, wai_err *err) {
  const int me = c->me, S = c->S, guard = e->wire.nonfinite_guard;
  const size_t n = e->wire.n;
  describe(e, c);
  if (guard && wai_coll_poisoned(&e->wire, c)) {
    /* Every member refuses it (R is bitwise identical); whose NaN it was only the contributions
     * tell: this rank tests its own (rare, one pass). */
    wai_refuse(e, r, c->t, wai_coll_own_nonfinite(&e->wire, c));
    return WA_OK;
  }
  wa_buf *x;
  if (c->fresh[me] || r->late == WA_LATE_DISCARD) {
    x = wai_buf_ref(c->result);
  } else {
    /* Late: MERGE replaces the stale contribution the group used by the fresh one; APPLY adds
     * all of the progress made since that contribution. */
    x = wai_pool_get(&e->pool);
    if (!x) return wai_err_set(err, WA_ENOMEM, -1, "out of memory for a late member's result");
    if (wai_nonfinite_seen(late_result(x->data, c->result->data, c->contrib, e->buf, n,
                                       r->late == WA_LATE_APPLY, (float)S, guard))) {
      /* R is finite: this rank's fresh buf is not (or its progress overflowed), which it alone
       * contributes here; the on-time members keep R. */
      wai_buf_unref(&e->pool, x);
      wai_refuse(e, r, c->t, 1);
      return WA_OK;
    }
  }
  memcpy(e->buf, x->data, n * sizeof(float));
  wai_buf_unref(&e->pool, e->published);
  if (r->reset) {
    wai_buf_unref(&e->pool, x);
    x = wai_pool_get(&e->pool);
    if (!x) {
      e->published = NULL;
      return wai_err_set(err, WA_ENOMEM, -1, "out of memory for a zero contribution");
    }
    memset(x->data, 0, n * sizeof(float));
  }
  e->published = x;
  e->published_version = c->t + 1;
  wai_request_done(e, r);
  return WA_OK;
}

/* wa_synchronize's collective: every rank took part with its own buf (a global never runs on a
 * rank's behalf), so R is the blocking global's average. It is what this rank continues from, so
 * it stands in for it from now on. Outside the iteration schedule: e->last is left alone. */
static void deliver_sync(wa_engine *e, wa_coll *c, wa_req *r) {
  if (e->wire.nonfinite_guard && wai_coll_poisoned(&e->wire, c)) {
    wai_refuse(e, r, c->t, wai_coll_own_nonfinite(&e->wire, c));
    return;
  }
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
