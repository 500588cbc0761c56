/* WA_GLOBAL_OVERLAP (wa.h): a global iteration's call contributes a snapshot U of buf and returns
 * at once; the average A completes in the background (activation.c keeps it as e->outstanding)
 * and the first later call that finds it complete applies it with the APPLY rule,
 * buf = A + (buf - U). */
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
}

/* Apply the completed overlapped global to buf with the APPLY rule, buf = A + (buf - U) (mu held,
 * the application thread blocked in the call r, so writing buf is allowed). */
void wai_apply_outstanding(wa_engine *e, wa_req *r) {
  wa_coll *c = e->outstanding;
  const float *restrict A = c->result->data, *restrict U = c->contrib;
  float *restrict W = e->buf;
  for (size_t i = 0; i < e->wire.n; i++) W[i] = A[i] + (W[i] - U[i]);
  r->applied_global = c->t;
  r->global_lag = e->next_t - c->t;
  if (r->kind == REQ_SETTLE) describe_global(e, c);
  e->outstanding = NULL;
  e->outstanding_done = 0;
  wai_coll_free(&e->wire, c);
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
  wai_request_done(e, r);
  return WA_OK;
}

