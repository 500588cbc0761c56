/* One collective as the engine sees it: made for a member set with its schedule chosen once
 * (wai_coll_new), started, advanced, asked who is missing and whether its result is poisoned, and
 * freed. Which schedule runs is decided here and nowhere else: the direct one (schedule.c) or,
 * for members that share nodes, the node-aware one (schedule_hier.c); c->ops is that schedule's
 * table of operations, and every later call goes through it. The schedules never call this file:
 * they are handed the collective and the wire, and build on schedule_parts.c.
 *
 * Like the schedules, this file sees only the wire (wa_internal.h), never the engine. */
#include <stdlib.h>
#include <string.h>

#include "wa_internal.h"

int wai_coll_member_index(const wa_coll *c, int rank) {
  int lo = 0, hi = c->S - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (c->members[mid] == rank) return mid;
    if (c->members[mid] < rank) lo = mid + 1;
    else hi = mid - 1;
  }
  return -1;
}

/* The node-aware schedule runs when the ranks' nodes are known (w->node_of), the buffer is at
 * least w->hier_min floats, the collective is not on the 16-bit wire (its arithmetic is defined in
 * member order, which node partials would change) and its S >= 4 members sit p >= 2 to a node on
 * N >= 2 nodes (the member set's layout, node_layout.c). Otherwise the direct one. */
static int choose_schedule(const wai_wire *w, wa_coll *c, wai_err *err) {
  c->ops = &wai_sched_flat;
  if (!w->node_of || c->S < 4 || w->n < w->hier_min || c->lowp) return WA_OK;
  wai_layout *l = NULL;
  int rc = wai_layout_get(w->layouts, w->node_of, c->members, c->S, &l, err);
  if (rc != WA_OK) return rc;
  if (l->N == 0) {
    wai_layout_unref(l);
    return WA_OK;
  }
  c->layout = l;
  c->N = l->N;
  c->p = l->p;
  c->node_idx = l->node_idx;
  c->local_idx = l->local_idx;
  c->grid = l->grid;
  c->my_node = l->node_idx[c->me];
  c->my_local = l->local_idx[c->me];
  c->ops = &wai_sched_hier;
  return WA_OK;
}

int wai_coll_new(const wai_wire *w, int64_t t, int is_global, const int *members, int S,
                 wa_coll **out, wai_err *err) {
  *out = NULL;
  wa_coll *c = calloc(1, sizeof *c);
  if (!c) return wai_err_set(err, WA_ENOMEM, -1, "out of memory for a collective");
  c->t = t;
  c->is_global = is_global;
  c->S = S;
  c->members = malloc(sizeof(int) * (size_t)S);
  c->indices = malloc(sizeof(int) * (size_t)S);
  c->statuses = malloc(sizeof(MPI_Status) * (size_t)S);
  c->pend = malloc((size_t)S);
  c->act_from = calloc((size_t)S, 1);
  c->fresh = calloc((size_t)S, 1);
  c->version = calloc((size_t)S, sizeof(int64_t));
  c->rq = malloc(sizeof(MPI_Request) * 5 * (size_t)S);
  if (!c->members || !c->indices || !c->statuses || !c->pend || !c->act_from || !c->fresh || !c->version || !c->rq) {
    wai_coll_free(w, c);
    return wai_err_set(err, WA_ENOMEM, -1, "out of memory for a collective");
  }
  memcpy(c->members, members, sizeof(int) * (size_t)S);
  for (int i = 0; i < 5 * S; i++) c->rq[i] = MPI_REQUEST_NULL;
  c->me = wai_coll_member_index(c, w->rank);
  c->stage = STAGE_IDLE;
  /* Only iterations of the schedule: wa_synchronize's collectives (t < 0) stay float32. */
  c->lowp = is_global && t >= 0 ? w->global_precision : WA_PRECISION_FP32;
  int rc = choose_schedule(w, c, err);
  if (rc != WA_OK) {
    wai_coll_free(w, c);
    return rc;
  }
  *out = c;
  return WA_OK;
}

int wai_coll_start(const wai_wire *w, wa_coll *c, const float *contrib, wa_buf *snap, int fresh,
                   int64_t version, wai_err *err) {
  c->contrib = contrib;
  c->contrib_snap = snap;
  c->fresh[c->me] = (unsigned char)fresh;
  c->version[c->me] = version;
  c->result = wai_pool_get(w->pool);
  if (!c->result)
    return wai_err_set(err, WA_ENOMEM, -1, "out of memory for a %zu-float result buffer", w->n);
  c->act_msg = (wa_msg){.kind = MSG_ACT, .t = c->t, .fresh = fresh, .version = version};
  return c->ops->start(w, c, err);
}

int wai_coll_advance(const wai_wire *w, wa_coll *c, int *progressed, wai_err *err) {
  return c->ops->advance(w, c, progressed, err);
}

int wai_coll_poisoned(const wai_wire *w, const wa_coll *c) { return c->ops->poisoned(w, c); }

int wai_coll_missing(const wa_coll *c, int *out) {
  /* No MPI calls: this also runs while the process exits inside MPI (lifecycle.c, exit report). */
  return c->ops->missing(c, out);
}

size_t wai_coll_bytes(const wai_wire *w, const wa_coll *c) {
  return c->S > 1 ? 2 * w->n * (c->lowp ? sizeof(uint16_t) : sizeof(float)) : 0;
}

int wai_coll_own_nonfinite(const wai_wire *w, const wa_coll *c) {
  return c->lowp ? c->own_bad : wai_block_nonfinite(c->contrib, w->n);
}

void wai_coll_free(const wai_wire *w, wa_coll *c) {
  if (!c) return;
  wai_buf_unref(w->pool, c->result);
  wai_buf_unref(w->pool, c->gather);
  wai_buf_unref(w->pool, c->contrib_snap);
  wai_buf_unref(w->pool, c->part);
  wai_buf_unref(w->pool, c->pack);
  wai_layout_unref(c->layout);
  free(c->members);
  free(c->indices);
  free(c->statuses);
  free(c->pend);
  free(c->act_from);
  free(c->fresh);
  free(c->version);
  free(c->rq);
  free(c);
}

void wai_coll_abandon(wa_coll *c) {
  /* Receives can be cancelled; sends cannot. The collective's memory (the ACT payload, the
   * contribution, the result and gather space a matched receive may still write) is deliberately
   * leaked rather than reused: this runs only on the error path. The engine is being torn down, so
   * a failure of these calls could change nothing and is not reported. */
  for (int i = 0; c->rq && i < 5 * c->S; i++) {
    if (c->rq[i] == MPI_REQUEST_NULL) continue;
    int set = i / c->S;
    wai_drop_request(&c->rq[i], set == RQ_DATA_RECV || set == RQ_RES_RECV);
  }
}
