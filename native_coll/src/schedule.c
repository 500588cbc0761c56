/* The schedule of one collective over a group of S members (reduce-scatter + allgather, direct).
 *
 * Member k owns chunk k of the buffer. Every member sends chunk k of its contribution to member k;
 * the owner sums the S pieces in member order, divides by S and sends the averaged chunk to every
 * member. Each chunk of the result is therefore computed exactly once, which is what makes results
 * bitwise identical on every on-time member. Bandwidth per member is 2 (S - 1) / S of the buffer,
 * the same as a ring, in two message rounds. (A pairwise schedule with one send in flight per phase
 * measured slower here: every step then waits for the peer's progress thread to be scheduled.)
 *
 * Every member also sends an ACT message (contribution fresh or stale, and its version) to every
 * other member when it starts; the first ACT a member receives activates its part (activation.c).
 *
 * When the members share nodes (two or more on each of two or more nodes) the node-aware schedule of
 * schedule_hier.c runs instead: coll.c chooses once, when it makes the collective, and calls this
 * schedule only through its table of operations (wai_sched_flat, at the end).
 *
 * A global iteration on the 16-bit wire (wa_set_global_precision; c->lowp) runs this schedule with
 * 16-bit messages: every member encodes its whole pseudo-gradient round16(buf - B) once at the
 * start (c->pack) and sends its chunks from there as MPI_UINT16_T; the owner decodes the pieces,
 * sums them in member order, divides by S, rounds the mean once and sends it in 16 bits; once
 * every chunk's mean has arrived each member computes result = B + decode(mean), testing each
 * chunk as it does (the guard's NaN mark then comes from that pass, the same on every member).
 *
 * The schedule sees only the wire (wa_internal.h) the engine hands it, never the engine: a failure is
 * reported by the return code and the caller's error slot, and the engine decides what it means. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "wa_internal.h"

static void reduce_my_chunk(const wai_wire *w, wa_coll *c);
static void decode_result(const wai_wire *w, wa_coll *c);

/* The 16-bit wire's buffer (c->pack): my encoded deltas, then every chunk's 16-bit mean. */
static inline uint16_t *pack16(const wa_coll *c) { return (uint16_t *)c->pack->data; }
static inline uint16_t *mean16(const wai_wire *w, const wa_coll *c) { return pack16(c) + w->n; }
static inline size_t wire_unit(const wa_coll *c) { return c->lowp ? sizeof(uint16_t) : sizeof(float); }

/* Post the remaining sends of one phase, staggered (member me + k first) so that members do not
 * all send to the same owner at once. */
static int pump(const wai_wire *w, wa_coll *c, int set, int *k, int *progressed, wai_err *err) {
  const int S = c->S, me = c->me;
  MPI_Request *rq = wai_rq_set(c, set);
  while (*k < S) {
    int j = (me + *k) % S;
    size_t off, len;
    wai_chunk_of(w->n, S, j, &off, &len);
    const void *src;
    int tag;
    if (set == RQ_DATA_SEND) {
      src = c->lowp ? (const void *)(pack16(c) + off) : (const void *)(c->contrib + off);
      tag = wai_tag_data(w, c->t);
    } else { /* every member gets my (the owner's) reduced chunk */
      wai_chunk_of(w->n, S, me, &off, &len);
      src = c->lowp ? (const void *)(mean16(w, c) + off) : (const void *)(c->result->data + off);
      tag = wai_tag_res(w, c->t);
    }
    WAI_CHECK_MPI(err, c->members[j],
                  MPI_Isend(src, (int)len, c->lowp ? MPI_UINT16_T : MPI_FLOAT, c->members[j], tag,
                            w->comm, &rq[j]));
    c->bytes_sent += (int64_t)(len * wire_unit(c));
    (*k)++;
    *progressed = 1;
  }
  return WA_OK;
}

static int start(const wai_wire *w, wa_coll *c, wai_err *err) {
  const int S = c->S, me = c->me;
  if (c->lowp) { /* the whole pseudo-gradient in 16 bits, once: the data sends come from here */
    c->pack = wai_pool_get(w->pool);
    if (!c->pack)
      return wai_err_set(err, WA_ENOMEM, -1, "out of memory for a %zu-float pack buffer", w->n);
    c->own_bad = wai_encode_delta16(c->lowp, pack16(c), c->contrib, w->global_base, w->n);
  }
  if (S == 1) { /* my chunk is the whole buffer: reduced (copied and tested) at once */
    reduce_my_chunk(w, c);
    if (c->lowp) decode_result(w, c);
    c->stage = STAGE_DONE;
    return WA_OK;
  }
  c->gather = wai_pool_get(w->pool);
  if (!c->gather)
    return wai_err_set(err, WA_ENOMEM, -1, "out of memory for a %zu-float gather buffer", w->n);
  size_t my_off, my_len;
  wai_chunk_of(w->n, S, me, &my_off, &my_len);
  int td = wai_tag_data(w, c->t), tr = wai_tag_res(w, c->t);

  /* Receives first so peers' data lands directly; ACTs before data so peers start early. */
  for (int j = 0; j < S; j++) {
    if (j == me) continue;
    size_t off, len;
    wai_chunk_of(w->n, S, j, &off, &len);
    void *data = c->lowp ? (void *)((uint16_t *)c->gather->data + (size_t)j * my_len)
                         : (void *)(c->gather->data + (size_t)j * my_len);
    void *res = c->lowp ? (void *)(mean16(w, c) + off) : (void *)(c->result->data + off);
    MPI_Datatype type = c->lowp ? MPI_UINT16_T : MPI_FLOAT;
    WAI_CHECK_MPI(err, c->members[j],
                  MPI_Irecv(data, (int)my_len, type, c->members[j], td, w->comm,
                            &wai_rq_set(c, RQ_DATA_RECV)[j]));
    WAI_CHECK_MPI(err, c->members[j],
                  MPI_Irecv(res, (int)len, type, c->members[j], tr, w->comm,
                            &wai_rq_set(c, RQ_RES_RECV)[j]));
  }
  int rc = wai_coll_send_acts(w, c, err);
  if (rc != WA_OK) return rc;
  c->data_k = 1;
  c->res_k = S; /* result sends start once my chunk is reduced */
  c->stage = STAGE_DATA;
  int progressed = 0;
  return pump(w, c, RQ_DATA_SEND, &c->data_k, &progressed, err);
}

/* Sum the S pieces of my chunk in member order and divide by S: the one place a result chunk is
 * computed. With the guard on, the last loop over each block also tests it, and a chunk holding NaN
 * or inf leaves with its first element NaN (wai_coll_poisoned). */
static void reduce_my_chunk_16(const wai_wire *w, wa_coll *c);

static void reduce_my_chunk(const wai_wire *w, wa_coll *c) {
  if (c->lowp) {
    reduce_my_chunk_16(w, c);
    return;
  }
  int S = c->S, me = c->me;
  uint32_t seen = 0;
  size_t off, len;
  wai_chunk_of(w->n, S, me, &off, &len);
  float *restrict dst = c->result->data + off;
  const float fs = (float)S;
  /* Cache-sized blocks: one pass over memory, the same order of additions for every element. */
  for (size_t b = 0; b < len; b += WAI_BLOCK) {
    size_t m = len - b < WAI_BLOCK ? len - b : WAI_BLOCK;
    float *restrict d = dst + b;
    for (int k = 0; k < S; k++) {
      const float *restrict src =
          ((k == me) ? c->contrib + off : c->gather->data + (size_t)k * len) + b;
      if (k == 0) memcpy(d, src, m * sizeof(float));
      else
        for (size_t i = 0; i < m; i++) d[i] += src[i];
    }
    if (w->nonfinite_guard)
      for (size_t i = 0; i < m; i++) {
        d[i] /= fs;
        seen |= wai_nonfinite_bits(d[i]);
      }
    else
      for (size_t i = 0; i < m; i++) d[i] /= fs;
  }
  if (wai_nonfinite_seen(seen)) dst[0] = NAN;
}

/* The 16-bit wire's reduction: the S encoded pieces of my chunk decoded and summed in member
 * order, divided by S and rounded once (into mean16). Tested later, when every member applies
 * the means (decode_result). */
static void reduce_my_chunk_16(const wai_wire *w, wa_coll *c) {
  int S = c->S, me = c->me;
  size_t off, len;
  wai_chunk_of(w->n, S, me, &off, &len);
  const uint16_t *gather = c->gather ? (const uint16_t *)c->gather->data : NULL;
  float acc[WAI_BLOCK];
  for (size_t b = 0; b < len; b += WAI_BLOCK) {
    size_t m = len - b < WAI_BLOCK ? len - b : WAI_BLOCK;
    for (int k = 0; k < S; k++) {
      const uint16_t *src = ((k == me) ? pack16(c) + off : gather + (size_t)k * len) + b;
      wai_sum16(c->lowp, acc, src, m, k == 0);
    }
    wai_mean16(c->lowp, mean16(w, c) + off + b, acc, m, (float)S);
  }
}

/* The 16-bit wire's last step, on every member once every chunk's mean is here:
 * result = B + decode(mean), each chunk tested as it is computed (its first element NaN when it
 * is not finite, the guard's mark); every member computes the same bits. */
static void decode_result(const wai_wire *w, wa_coll *c) {
  for (int k = 0; k < c->S; k++) {
    size_t off, len;
    wai_chunk_of(w->n, c->S, k, &off, &len);
    int bad = wai_apply16(c->lowp, c->result->data + off, w->global_base + off,
                          mean16(w, c) + off, len);
    if (bad && w->nonfinite_guard && len > 0) c->result->data[off] = NAN;
  }
}

static int poisoned(const wai_wire *w, const wa_coll *c) {
  for (int k = 0; k < c->S; k++) {
    size_t off, len;
    wai_chunk_of(w->n, c->S, k, &off, &len);
    if (len > 0 && isnan(c->result->data[off])) return 1;
  }
  return 0;
}

static int advance(const wai_wire *w, wa_coll *c, int *progressed, wai_err *err) {
  int S = c->S, rc, done;
  if ((rc = pump(w, c, RQ_DATA_SEND, &c->data_k, progressed, err)) != WA_OK) return rc;
  if (c->stage == STAGE_DATA) {
    if ((rc = wai_coll_test_set(c, RQ_DATA_RECV, &done, err)) != WA_OK) return rc;
    if (!done) return WA_OK;
    reduce_my_chunk(w, c);
    c->res_k = 1;
    c->stage = STAGE_RESULT;
    *progressed = 1;
  }
  if (c->stage == STAGE_RESULT) {
    if ((rc = pump(w, c, RQ_RES_SEND, &c->res_k, progressed, err)) != WA_OK) return rc;
    if (c->data_k < S || c->res_k < S) return WA_OK;
    /* Every set is tested each time, so that the requests still open are exactly the ones
     * not completed (coll_missing names their peers). */
    static const int sets[] = {RQ_RES_RECV, RQ_DATA_SEND, RQ_RES_SEND, RQ_ACT_SEND};
    int all = 1;
    for (int i = 0; i < 4; i++) {
      if ((rc = wai_coll_test_set(c, sets[i], &done, err)) != WA_OK) return rc;
      all &= done;
    }
    if (!all) return WA_OK;
    /* The ACTs carry who was stale: the result is only reported once all have arrived. */
    if (c->acts < S - 1) return WA_OK;
    if (c->lowp) decode_result(w, c);
    c->stage = STAGE_DONE;
    *progressed = 1;
  }
  return WA_OK;
}

static int missing_members(const wa_coll *c, int *out) {
  /* No MPI calls: this also runs while the process exits inside MPI (lifecycle.c, exit report). */
  int n = 0;
  for (int j = 0; j < c->S; j++) {
    if (j == c->me) continue;
    int data_done = 1, res_done = 1, sends_done = 1;
    if (c->stage == STAGE_DATA || c->stage == STAGE_RESULT) {
      data_done = c->rq[(size_t)RQ_DATA_RECV * c->S + j] == MPI_REQUEST_NULL;
    }
    if (c->stage == STAGE_RESULT) {
      res_done = c->rq[(size_t)RQ_RES_RECV * c->S + j] == MPI_REQUEST_NULL;
      /* The sends are tested in this stage only. One to j still open means j has not taken it
       * (a rendezvous message waits for the receiver, an eager one for the network): all j
       * sent may have arrived while j itself is now unreachable. */
      static const int sends[] = {RQ_DATA_SEND, RQ_RES_SEND, RQ_ACT_SEND};
      for (int i = 0; i < 3; i++)
        if (c->rq[(size_t)sends[i] * c->S + j] != MPI_REQUEST_NULL) sends_done = 0;
    }
    if (!c->act_from[j] || !data_done || !res_done || !sends_done) out[n++] = c->members[j];
  }
  return n;
}

const wai_sched_ops wai_sched_flat = {
    .start = start, .advance = advance, .missing = missing_members, .poisoned = poisoned};
