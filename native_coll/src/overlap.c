/* WA_GLOBAL_OVERLAP (wa.h): a global iteration's call contributes a snapshot U of buf and returns
 * at once; the average A completes in the background (activation.c keeps it as e->outstanding)
 * and the first later call that finds it complete applies it with the APPLY rule,
 * buf = A + (buf - U), or with an outer optimizer (wa_set_outer) buf = T + (buf - U). A poisoned A
 * (NaN or inf in a snapshot) is refused there instead, and a snapshot that is not finite is
 * reported by the global call itself (wa.h). */
#include <stdio.h>
#include <string.h>

#include "engine.h"

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
  e->last.nodes = c->N;
  e->last.bytes_sent = c->bytes_sent;
}

/* The outstanding global is done with (applied or refused): free it. */
static void drop_outstanding(wa_engine *e) {
  wai_coll_free(&e->wire, e->outstanding);
  e->outstanding = NULL;
  e->outstanding_done = 0;
  e->outstanding_told = 0;
}

/* Apply the completed overlapped global to buf with the APPLY rule, buf = A + (buf - U) (mu held,
 * the application thread blocked in the call r, so writing buf is allowed). A poisoned A is
 * dropped instead, and r ends with WA_ENONFINITE before anything else happens in it (returns 1),
 * unless this rank's own snapshot poisoned it (already reported by its global call). */
int wai_apply_outstanding(wa_engine *e, wa_req *r) {
  wa_coll *c = e->outstanding;
  if (e->wire.nonfinite_guard && wai_coll_poisoned(&e->wire, c)) {
    const int report = !e->outstanding_told;
    if (report) {
      describe_global(e, c);
      r->kept_iteration = 1;
      wai_refuse(e, r, c->t, wai_coll_own_nonfinite(&e->wire, c));
    }
    drop_outstanding(e);
    return report;
  }
  const float *restrict A = c->result->data, *restrict U = c->contrib;
  float *restrict W = e->buf;
  /* The 16-bit wire's base B becomes the applied global model (wa_set_global_precision): here,
   * before this rank's next global snapshot, as on every rank. Unless it is the outer step's
   * prev, which becomes T below anyway. */
  float *B = c->lowp && e->global_base != e->outer_prev ? e->global_base : NULL;
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
      if (B) B[i] = t;
      W[i] = t + (W[i] - U[i]);
    }
  } else {
    if (B) memcpy(B, A, e->wire.n * sizeof(float));
    for (size_t i = 0; i < e->wire.n; i++) W[i] = A[i] + (W[i] - U[i]);
  }
  r->applied_global = c->t;
  r->global_lag = e->next_t - c->t;
  if (r->kind == REQ_SETTLE) describe_global(e, c);
  drop_outstanding(e);
  return 0;
}

/* Copy buf into the snapshot; with the guard on, in a loop that also tests it (as fast as memcpy
 * here): 1 when it holds NaN or inf. */
static int snapshot(wa_engine *e, float *restrict snap) {
  const float *restrict buf = e->buf;
  const size_t n = e->wire.n;
  if (!e->wire.nonfinite_guard) {
    memcpy(snap, buf, n * sizeof(float));
    return 0;
  }
  uint32_t seen = 0;
  for (size_t i = 0; i < n; i++) {
    snap[i] = buf[i];
    seen |= wai_nonfinite_bits(buf[i]);
  }
  return wai_nonfinite_seen(seen);
}

/* WA_GLOBAL_OVERLAP: contribute a snapshot of buf to global iteration r->t and let the call return
 * at once; the average completes in the background and is applied by a later call. */
int wai_start_overlapped_global(wa_engine *e, wa_req *r, wai_err *err) {
  /* Globals are never started on a rank's behalf, so c is absent or idle (peers' ACTs). */
  wa_coll *c = wai_engine_find(e->active, r->t);
  int rc;
  if (!c && (rc = wai_new_active(e, r->t, &c, err)) != WA_OK) return rc;
  wa_buf *snap = wai_pool_get(&e->pool);
  wa_buf *pub = !snap ? NULL : r->reset ? wai_pool_get(&e->pool) : wai_buf_ref(snap);
  if (!pub) {
    wai_buf_unref(&e->pool, snap);
    wai_buf_unref(&e->pool, pub);
    return wai_err_set(err, WA_ENOMEM, -1, "out of memory for a global snapshot");
  }
  int bad = snapshot(e, snap->data);
  if (r->reset) memset(pub->data, 0, e->wire.n * sizeof(float));
  e->outstanding = c;
  e->outstanding_done = 0;
  e->outstanding_told = bad;
  if ((rc = wai_coll_start(&e->wire, c, snap->data, snap, 1, r->t, err)) != WA_OK) {
    wai_buf_unref(&e->pool, pub);
    return rc;
  }
  if (e->wire.nonfinite_guard && c->lowp && c->own_bad) /* a finite snapshot whose delta
                                                             overflowed 16 bits: the same case */
    e->outstanding_told = bad = 1;
  describe_global(e, c);
  if (bad) {
    /* Contributed all the same, so that A completes on every rank (and is refused there); not
     * published, so the groups run on this rank's behalf keep its last contribution. */
    wai_buf_unref(&e->pool, pub);
    wai_refuse(e, r, r->t, 1);
    return WA_OK;
  }
  /* The snapshot is also what stands in for this rank in group iterations run on its behalf
   * until its next call: the model it continued from, as after a blocking call. */
  wai_buf_unref(&e->pool, e->published);
  e->published = pub;
  e->published_version = r->t + 1;
  wai_request_done(e, r);
  return WA_OK;
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
