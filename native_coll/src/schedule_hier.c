/* The node-aware schedule of one collective: for members that share nodes, so that the link between
 * nodes carries what MPICH's node-aware allreduce sends across it, not the whole buffer twice.
 *
 * It runs when the members are on N >= 2 nodes with the same number p >= 2 of them on each (and the
 * buffer holds at least wire->hier_min floats); otherwise the direct schedule (schedule.c) runs.
 * coll.c decides once, when it makes the collective, from the member set's node layout (computed
 * once per member set, node_layout.c: c->node_idx, local_idx and grid point into it), and calls
 * this schedule only through its table of operations (wai_sched_hier, at the end).
 * A global iteration on the 16-bit wire (wa_set_global_precision) always runs the direct schedule:
 * its arithmetic (each member's delta rounded, the mean over members rounded once) is defined in
 * member order, which the node partials here would change.
 * Nodes are ordered by their lowest member, the members of a node by rank: member (a, l) is the
 * l-th member on node a. The buffer is cut into p slices and slice l into N pieces; (a, l) owns
 * piece a of slice l. Four steps, each a direct exchange:
 *   HIER_LOCAL      within the node: every member sends slice l of its contribution to local
 *                   member l, which sums the node's p slices in local order (its node's partial);
 *   HIER_CROSS      across nodes, among the members with the same l (one per node): piece b of
 *                   the partial goes to (b, l), which sums the N partials in node order and
 *                   divides by the S members: the one place a piece of the result is computed;
 *   HIER_CROSS_RES  the averaged piece goes back to the same N - 1 members;
 *   STAGE_RESULT    within the node: the averaged slice l goes to the node's other members.
 * Per node the link carries 2 (N - 1) / N of the buffer, spread over the node's p members, against
 * 2 p (N - 1) / N for the direct schedule. Each element is still reduced once, by its owner, in a
 * fixed order (node partials in local order, then nodes in order), so results stay bitwise
 * identical on every member; the order differs from the direct schedule's member order, so a
 * result can differ from that schedule's in the last bits.
 *
 * The contract of wa.h does not change: every member still sends its ACT to every other member
 * (first-arrival activation, the staleness report), a member runs its part with its published
 * contribution when it has not called, and the request slots are the direct schedule's (member j is
 * either on my node or one of my cross-node peers, never both), so a timeout names the members whose
 * messages are missing at the step this member is in (missing_members). The non-finite guard is
 * the direct schedule's: the owner of a piece tests it as it divides it, and a poisoned piece
 * leaves with its first element NaN (poisoned() reads one float per piece). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "wa_internal.h"

/* Slice l of the buffer, and piece a of my slice (offset within the slice). */
static void slice_of(const wai_wire *w, const wa_coll *c, int l, size_t *off, size_t *len) {
  wai_chunk_of(w->n, c->p, l, off, len);
}

static void piece_of(const wai_wire *w, const wa_coll *c, int a, size_t *off, size_t *len) {
  size_t s_off, s_len;
  slice_of(w, c, c->my_local, &s_off, &s_len);
  wai_chunk_of(s_len, c->N, a, off, len);
}

static int is_local(const wa_coll *c, int j) { return c->node_idx[j] == c->my_node; }
static int is_cross(const wa_coll *c, int j) {
  return !is_local(c, j) && c->local_idx[j] == c->my_local;
}

/* Where the pieces land: gather holds the node's p slices l = my_local (slot = local index), part
 * holds my node's partial of my slice, then the N nodes' partials of my piece (slot = node). */
static float *local_slot(const wai_wire *w, const wa_coll *c, int l) {
  size_t off, len;
  slice_of(w, c, c->my_local, &off, &len);
  return c->gather->data + (size_t)l * len;
}

static float *cross_slot(const wai_wire *w, const wa_coll *c, int a) {
  size_t s_off, s_len, p_off, p_len;
  slice_of(w, c, c->my_local, &s_off, &s_len);
  piece_of(w, c, c->my_node, &p_off, &p_len);
  return c->part->data + s_len + (size_t)a * p_len;
}

static int start(const wai_wire *w, wa_coll *c, wai_err *err) {
  c->gather = wai_pool_get(w->pool);
  if (c->gather) c->part = wai_pool_get(w->pool);
  if (!c->gather || !c->part)
    return wai_err_set(err, WA_ENOMEM, -1, "out of memory for a %zu-float gather buffer", w->n);
  const int S = c->S, me = c->me;
  const int td = wai_tag_data(w, c->t), tr = wai_tag_res(w, c->t);
  size_t my_off, my_len;
  slice_of(w, c, c->my_local, &my_off, &my_len);
  /* Every receive first, so that peers' pieces land in place; then the ACTs; then my slices to the
   * node's other members (staggered from my own position). */
  for (int j = 0; j < S; j++) {
    if (j == me) continue;
    float *data = NULL, *res = NULL;
    size_t data_len = 0, res_len = 0, off, len;
    if (is_local(c, j)) {
      data = local_slot(w, c, c->local_idx[j]);
      data_len = my_len;
      slice_of(w, c, c->local_idx[j], &off, &len);
      res = c->result->data + off;
      res_len = len;
    } else if (is_cross(c, j)) {
      size_t p_off, p_len;
      piece_of(w, c, c->my_node, &p_off, &p_len);
      data = cross_slot(w, c, c->node_idx[j]);
      data_len = p_len;
      piece_of(w, c, c->node_idx[j], &off, &len);
      res = c->result->data + my_off + off;
      res_len = len;
    } else {
      continue; /* no data between us: only the ACTs */
    }
    WAI_CHECK_MPI(err, c->members[j],
                  MPI_Irecv(data, (int)data_len, MPI_FLOAT, c->members[j], td, w->comm,
                            &wai_rq_set(c, RQ_DATA_RECV)[j]));
    WAI_CHECK_MPI(err, c->members[j],
                  MPI_Irecv(res, (int)res_len, MPI_FLOAT, c->members[j], tr, w->comm,
                            &wai_rq_set(c, RQ_RES_RECV)[j]));
  }
  int rc = wai_coll_send_acts(w, c, err);
  if (rc != WA_OK) return rc;
  for (int k = 1; k < c->p; k++) {
    int l = (c->my_local + k) % c->p, j = c->grid[c->my_node * c->p + l];
    size_t off, len;
    slice_of(w, c, l, &off, &len);
    WAI_CHECK_MPI(err, c->members[j],
                  MPI_Isend(c->contrib + off, (int)len, MPI_FLOAT, c->members[j], td, w->comm,
                            &wai_rq_set(c, RQ_DATA_SEND)[j]));
    c->bytes_sent += (int64_t)(len * sizeof(float));
  }
  c->stage = STAGE_DATA;
  c->phase = HIER_LOCAL;
  return WA_OK;
}

/* Whether every request of `set` towards the members that pass `which` has completed (the set was
 * tested just before). */
static int done_for(wa_coll *c, int set, int (*which)(const wa_coll *, int)) {
  MPI_Request *rq = wai_rq_set(c, set);
  for (int j = 0; j < c->S; j++)
    if (j != c->me && which(c, j) && rq[j] != MPI_REQUEST_NULL) return 0;
  return 1;
}

/* To my peer on every other node: piece a of my node's partial to its owner (HIER_LOCAL -> CROSS),
 * or my averaged piece (HIER_CROSS -> CROSS_RES). */
static int send_cross(const wai_wire *w, wa_coll *c, int set, int tag, wai_err *err) {
  for (int k = 1; k < c->N; k++) {
    int a = (c->my_node + k) % c->N, j = c->grid[a * c->p + c->my_local];
    size_t s_off, s_len, off, len;
    slice_of(w, c, c->my_local, &s_off, &s_len);
    const float *src;
    if (set == RQ_DATA_SEND) { /* piece a of my node's partial, to its owner */
      piece_of(w, c, a, &off, &len);
      src = c->part->data + off;
    } else { /* my averaged piece, to every owner of a piece of my slice */
      piece_of(w, c, c->my_node, &off, &len);
      src = c->result->data + s_off + off;
    }
    WAI_CHECK_MPI(err, c->members[j],
                  MPI_Isend(src, (int)len, MPI_FLOAT, c->members[j], tag, w->comm,
                            &wai_rq_set(c, set)[j]));
    c->bytes_sent += (int64_t)(len * sizeof(float));
  }
  return WA_OK;
}

/* dst[0, len) = the sum of the k sources in order (blocks sized for the cache: one pass over
 * memory, the same order of additions for every element), divided by `div` when div > 0; with
 * `guard`, tested as it is divided, and its first element NaN when a value is not finite. */
static void sum_in_order(float *restrict dst, const float *const *src, int k, size_t len, int div,
                         int guard) {
  const float fd = (float)div;
  uint32_t seen = 0;
  for (size_t b = 0; b < len; b += WAI_BLOCK) {
    size_t m = len - b < WAI_BLOCK ? len - b : WAI_BLOCK;
    float *restrict d = dst + b;
    for (int i = 0; i < k; i++) {
      const float *restrict s = src[i] + b;
      if (i == 0) memcpy(d, s, m * sizeof(float));
      else
        for (size_t x = 0; x < m; x++) d[x] += s[x];
    }
    if (div > 0 && guard)
      for (size_t x = 0; x < m; x++) {
        d[x] /= fd;
        seen |= wai_nonfinite_bits(d[x]);
      }
    else if (div > 0)
      for (size_t x = 0; x < m; x++) d[x] /= fd;
  }
  if (len > 0 && wai_nonfinite_seen(seen)) dst[0] = NAN;
}

/* My node's partial of my slice: the p slices in local order. */
static int reduce_local(const wai_wire *w, wa_coll *c, wai_err *err) {
  size_t off, len;
  slice_of(w, c, c->my_local, &off, &len);
  const float **src = malloc(sizeof(float *) * (size_t)c->p);
  if (!src) return wai_err_set(err, WA_ENOMEM, -1, "out of memory for a collective");
  for (int l = 0; l < c->p; l++)
    src[l] = l == c->my_local ? c->contrib + off : local_slot(w, c, l);
  sum_in_order(c->part->data, src, c->p, len, 0, 0);
  free(src);
  return WA_OK;
}

/* My piece of the result: the N nodes' partials in node order, divided by S. */
static int reduce_cross(const wai_wire *w, wa_coll *c, wai_err *err) {
  size_t s_off, s_len, off, len;
  slice_of(w, c, c->my_local, &s_off, &s_len);
  piece_of(w, c, c->my_node, &off, &len);
  const float **src = malloc(sizeof(float *) * (size_t)c->N);
  if (!src) return wai_err_set(err, WA_ENOMEM, -1, "out of memory for a collective");
  for (int a = 0; a < c->N; a++)
    src[a] = a == c->my_node ? c->part->data + off : cross_slot(w, c, a);
  sum_in_order(c->result->data + s_off + off, src, c->N, len, c->S, w->nonfinite_guard);
  free(src);
  return WA_OK;
}

static int advance(const wai_wire *w, wa_coll *c, int *progressed, wai_err *err) {
  int rc, done;
  const int td = wai_tag_data(w, c->t), tr = wai_tag_res(w, c->t);
  if (c->stage == STAGE_DATA && c->phase == HIER_LOCAL) {
    if ((rc = wai_coll_test_set(c, RQ_DATA_RECV, &done, err)) != WA_OK) return rc;
    if (!done_for(c, RQ_DATA_RECV, is_local)) return WA_OK;
    if ((rc = reduce_local(w, c, err)) != WA_OK) return rc;
    if ((rc = send_cross(w, c, RQ_DATA_SEND, td, err)) != WA_OK) return rc;
    c->phase = HIER_CROSS;
    *progressed = 1;
  }
  if (c->stage == STAGE_DATA && c->phase == HIER_CROSS) {
    if ((rc = wai_coll_test_set(c, RQ_DATA_RECV, &done, err)) != WA_OK) return rc;
    if (!done) return WA_OK;
    if ((rc = reduce_cross(w, c, err)) != WA_OK) return rc;
    if ((rc = send_cross(w, c, RQ_RES_SEND, tr, err)) != WA_OK) return rc;
    c->phase = HIER_CROSS_RES;
    *progressed = 1;
  }
  if (c->stage == STAGE_DATA && c->phase == HIER_CROSS_RES) {
    if ((rc = wai_coll_test_set(c, RQ_RES_RECV, &done, err)) != WA_OK) return rc;
    if (!done_for(c, RQ_RES_RECV, is_cross)) return WA_OK;
    /* My whole slice is averaged: it goes to the node's other members. */
    size_t off, len;
    slice_of(w, c, c->my_local, &off, &len);
    for (int k = 1; k < c->p; k++) {
      int l = (c->my_local + k) % c->p, j = c->grid[c->my_node * c->p + l];
      WAI_CHECK_MPI(err, c->members[j],
                    MPI_Isend(c->result->data + off, (int)len, MPI_FLOAT, c->members[j], tr,
                              w->comm, &wai_rq_set(c, RQ_RES_SEND)[j]));
      c->bytes_sent += (int64_t)(len * sizeof(float));
    }
    c->stage = STAGE_RESULT;
    *progressed = 1;
  }
  if (c->stage == STAGE_RESULT) {
    static const int sets[] = {RQ_RES_RECV, RQ_DATA_SEND, RQ_RES_SEND, RQ_ACT_SEND};
    int all = 1;
    for (int i = 0; i < 4; i++) {
      if ((rc = wai_coll_test_set(c, sets[i], &done, err)) != WA_OK) return rc;
      all &= done;
    }
    if (!all || c->acts < c->S - 1) return WA_OK;
    wai_buf_unref(w->pool, c->part); /* every send from it has completed */
    c->part = NULL;
    c->stage = STAGE_DONE;
    *progressed = 1;
  }
  return WA_OK;
}

static int missing_members(const wa_coll *c, int *out) {
  /* No MPI calls (the exit report runs this too). Members whose ACT has not come never started
   * their part: when there are any, they are the ones named, since everyone else may only be
   * waiting for them (a cross-node peer waits for its node's members before it sends). Otherwise
   * the members whose messages are missing at this member's step: within the node during
   * HIER_LOCAL and STAGE_RESULT, across nodes during HIER_CROSS and HIER_CROSS_RES. */
  int n = 0;
  const int S = c->S;
  for (int j = 0; j < S; j++)
    if (j != c->me && !c->act_from[j]) out[n++] = c->members[j];
  if (n > 0) return n;
  for (int j = 0; j < S; j++) {
    if (j == c->me) continue;
    int missing = 0;
    const MPI_Request *rq = c->rq;
    int data_open = rq[(size_t)RQ_DATA_RECV * S + j] != MPI_REQUEST_NULL;
    int res_open = rq[(size_t)RQ_RES_RECV * S + j] != MPI_REQUEST_NULL;
    if (c->stage == STAGE_DATA) {
      if (is_local(c, j) && c->phase == HIER_LOCAL && data_open) missing = 1;
      if (is_cross(c, j) && c->phase == HIER_CROSS && data_open) missing = 1;
      if (is_cross(c, j) && c->phase == HIER_CROSS_RES && res_open) missing = 1;
    } else if (c->stage == STAGE_RESULT) {
      if (res_open) missing = 1;
      static const int sends[] = {RQ_DATA_SEND, RQ_RES_SEND, RQ_ACT_SEND};
      for (int i = 0; i < 3; i++)
        if (rq[(size_t)sends[i] * S + j] != MPI_REQUEST_NULL) missing = 1;
    }
    if (missing) out[n++] = c->members[j];
  }
  return n;
}

static int poisoned(const wai_wire *w, const wa_coll *c) {
  for (int l = 0; l < c->p; l++) {
    size_t s_off, s_len;
    wai_chunk_of(w->n, c->p, l, &s_off, &s_len);
    for (int a = 0; a < c->N; a++) {
      size_t off, len;
      wai_chunk_of(s_len, c->N, a, &off, &len);
      if (len > 0 && isnan(c->result->data[s_off + off])) return 1;
    }
  }
  return 0;
}

const wai_sched_ops wai_sched_hier = {
    .start = start, .advance = advance, .missing = missing_members, .poisoned = poisoned};
