/* The activation protocol, run by the progress thread: its poll callback (wai_engine_poll, called
 * by progress.c with e->mu held) takes the application's request, answers the peers' activations
 * (the first ACT for an iteration makes this rank take part, with its last published contribution
 * when the application has not called yet), advances every collective under way, hands finished
 * ones on (results.c, overlap.c) and notices the end of a close. Which collectives exist lives here:
 * the active and pending lists. */
#include <stdio.h>
#include <string.h>

#include "engine.h"

wa_coll *wai_engine_find(wa_coll *list, int64_t t) {
  for (wa_coll *c = list; c; c = c->next)
    if (c->t == t) return c;
  return NULL;
}

static void unlink_coll(wa_coll **list, wa_coll *c) {
  for (wa_coll **p = list; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      c->next = NULL;
      return;
    }
}

static void push(wa_coll **list, wa_coll *c) {
  c->next = *list;
  *list = c;
}

/* A new idle collective for iteration t on the active list: all ranks for a global, else the
 * group rule's members (wa.h). */
int wai_new_active(wa_engine *e, int64_t t, wa_coll **out, wai_err *err) {
  int global = wai_is_global(e, t), S;
  if (global) {
    S = e->P;
    for (int i = 0; i < e->P; i++) e->scratch[i] = i;
  } else {
    S = wa_group_of(e->P, e->S, t, e->wire.rank, e->scratch);
  }
  int rc = wai_coll_new(&e->wire, t, global, e->scratch, S, out, err);
  if (rc == WA_OK) push(&e->active, *out);
  return rc;
}

/* A collective finished: deliver it, or keep it pending until the application calls. */
static int complete(wa_engine *e, wa_coll *c, wai_err *err) {
  unlink_coll(&e->active, c);
  if (c == e->outstanding) {
    /* An overlapped global: its average waits for the application's next call (overlap.c). */
    wai_buf_unref(&e->pool, c->gather);
    c->gather = NULL;
    e->outstanding_done = 1;
    return WA_OK;
  }
  if (c->app) return wai_deliver_and_free(e, c, c->app, err);
  /* Completed on this rank's behalf: keep the result (and the contribution it used, for the late
   * merge) until the application calls. The scratch space can go now. */
  wai_buf_unref(&e->pool, c->gather);
  c->gather = NULL;
  push(&e->pending, c);
  return WA_OK;
}


/* Take the application's request, if there is one the engine can act on now (*progressed = 1). */
static int take_request(wa_engine *e, int *progressed, wai_err *err) {
  wa_req *r = e->req;
  if (!r || r->taken) return WA_OK;
  if (r->kind == REQ_CLOSE) {
    r->taken = 1;
    *progressed = 1;
    e->fin_msg = (wa_msg){.kind = MSG_FIN, .t = e->next_t};
    for (int j = 0; j < e->P; j++) {
      if (j == e->wire.rank) continue;
      if (MPI_Isend(&e->fin_msg, WAI_MSG_WORDS, MPI_INT64_T, j, WAI_TAG_CTRL, e->wire.comm,
                    &e->fin_rq[j]) != MPI_SUCCESS)
        return wai_err_set(err, WA_EMPI, j, "MPI_Isend of the close notice to rank %d failed", j);
    }
    e->closing = 1;
    return WA_OK;
  }
  if (e->outstanding) {
    if (e->outstanding_done) {
      if (wai_apply_outstanding(e, r)) { /* a poisoned A: r ended (WA_ENONFINITE) */
        r->taken = 1;
        *progressed = 1;
        return WA_OK;
      }
    } else if (r->kind == REQ_SETTLE || wai_is_global(e, r->t)) {
      /* The staleness bound (wa.h): the next global, settle and synchronize (t < 0) wait for the
       * outstanding average, i.e. for every rank to have arrived at it. Not taken: retried on
       * every pass of the progress loop. */
      return WA_OK;
    }
  }
  r->taken = 1;
  *progressed = 1;
  if (r->kind == REQ_SETTLE) {
    wai_request_done(e, r);
    return WA_OK;
  }
  if (r->kind == REQ_SYNC)
    e->syncs++; /* its collective r->t is started below, like a blocking global's */
  else if (e->global_mode == WA_GLOBAL_OVERLAP && wai_is_global(e, r->t))
    return wai_start_overlapped_global(e, r, err);
  wa_coll *c = wai_engine_find(e->pending, r->t);
  if (c) {
    unlink_coll(&e->pending, c);
    return wai_deliver_and_free(e, c, r, err);
  }
  c = wai_engine_find(e->active, r->t);
  if (c && c->stage != STAGE_IDLE) {
    c->app = r; /* started on our behalf with the published snapshot: finish it as a late member */
    return WA_OK;
  }
  int rc;
  if (!c && (rc = wai_new_active(e, r->t, &c, err)) != WA_OK) return rc;
  c->app = r;
  return wai_coll_start(&e->wire, c, e->buf, NULL, 1, r->t, err);
}

/* A peer's ACT for iteration msg->t (a synchronize for t < 0): the first one makes this rank take
 * part. A message that breaks the protocol is WA_EBROKEN, not WA_EMPI: no connection failed, so no
 * peer is named. */
static int on_act(wa_engine *e, int src, const wa_msg *msg, wai_err *err) {
  int64_t t = msg->t;
  wa_coll *c = wai_engine_find(e->active, t);
  char what[64];
  if (t < 0) wai_coll_name(e, t, what, sizeof what);
  else snprintf(what, sizeof what, "iteration %lld", (long long)t);
  if (!c) {
    int finished = t < 0 ? t > wai_sync_t(e->syncs) : t < e->next_t;
    if (finished || wai_engine_find(e->pending, t))
      return wai_err_set(err, WA_EBROKEN, -1, "protocol error: rank %d activated %s, which rank "
                         "%d already finished", src, what, e->wire.rank);
    int rc = wai_new_active(e, t, &c, err);
    if (rc != WA_OK) return rc;
  }
  int j = wai_coll_member_index(c, src);
  if (j < 0 || c->act_from[j])
    return wai_err_set(err, WA_EBROKEN, -1, "protocol error: rank %d activated %s but is not in "
                       "rank %d's group (do all ranks pass the same group_size and sync_period?)",
                       src, what, e->wire.rank);
  c->act_from[j] = 1;
  c->acts++;
  c->fresh[j] = (unsigned char)msg->fresh;
  c->version[j] = msg->version;
  if (c->stage == STAGE_IDLE && !c->is_global) { /* (never a global's or a synchronize's) */
    /* The application has not called for t: take part with the last published contribution. */
    return wai_coll_start(&e->wire, c, e->published->data, wai_buf_ref(e->published), 0,
                          e->published_version, err);
  }
  return WA_OK;
}

static int poll_control(wa_engine *e, int *progressed, wai_err *err) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    WAI_CHECK_MPI(err, -1, MPI_Test(&e->ctrl_req, &flag, &st));
    if (!flag) return WA_OK;
    *progressed = 1;
    wa_msg msg = e->ctrl_in; /* the receive is re-posted into ctrl_in at once */
    WAI_CHECK_MPI(err, -1, MPI_Irecv(&e->ctrl_in, WAI_MSG_WORDS, MPI_INT64_T, MPI_ANY_SOURCE,
                                     WAI_TAG_CTRL, e->wire.comm, &e->ctrl_req));
    if (msg.kind == MSG_ACT) {
      int rc = on_act(e, st.MPI_SOURCE, &msg, err);
      if (rc != WA_OK) return rc;
    } else if (msg.kind == MSG_FIN && !e->fin_from[st.MPI_SOURCE]) {
      e->fin_from[st.MPI_SOURCE] = 1;
      e->fins++;
    }
  }
}

static int advance_all(wa_engine *e, int *progressed, size_t *inflight, wai_err *err) {
  *inflight = 0;
  for (wa_coll *c = e->active, *next; c; c = next) {
    next = c->next;
    if (c->stage == STAGE_DATA || c->stage == STAGE_RESULT) {
      int rc = wai_coll_advance(&e->wire, c, progressed, err);
      if (rc != WA_OK) {
        e->failed_t = c->t; /* (failure.c names its members if MPI did not) */
        return rc;
      }
    }
    if (c->stage == STAGE_DONE) {
      int rc = complete(e, c, err);
      if (rc != WA_OK) return rc;
      *progressed = 1;
    } else if (c->stage != STAGE_IDLE) {
      *inflight += wai_coll_bytes(&e->wire, c);
    }
  }
  return WA_OK;
}

/* Close completes once every rank has announced its close (so nobody will activate a collective
 * involving us again) and every started collective has finished. */
static int close_ready(wa_engine *e, int *ready, wai_err *err) {
  *ready = 0;
  if (e->fins < e->P - 1) return WA_OK;
  for (wa_coll *c = e->active; c; c = c->next)
    if (c->stage != STAGE_IDLE) return WA_OK;
  int flag = 0;
  if (MPI_Testall(e->P, e->fin_rq, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
    return wai_err_set(err, WA_EMPI, -1, "MPI_Testall on close notices failed");
  if (!flag) return WA_OK;
  /* Nothing can arrive on the control tag any more: every peer's last message was its FIN. */
  WAI_CHECK_MPI(err, -1, MPI_Cancel(&e->ctrl_req));
  WAI_CHECK_MPI(err, -1, MPI_Wait(&e->ctrl_req, MPI_STATUS_IGNORE));
  *ready = 1;
  return WA_OK;
}

/* The progress thread's poll callback (progress.c), mu held: the application's request, the
 * peers' control messages, every collective under way, and the end of a close. */
int wai_engine_poll(void *ctx, size_t *inflight) {
  wa_engine *e = ctx;
  *inflight = 0;
  if (e->broken) return WAI_POLL_IDLE; /* MPI state is unknown: stay quiet until stopped */
  wai_err err;
  int progressed = 0, ready = 0;
  int rc = wai_ulfm_watch(e, &err);
  if (rc == WA_OK) rc = take_request(e, &progressed, &err);
  if (rc == WA_OK) rc = poll_control(e, &progressed, &err);
  if (rc == WA_OK) rc = advance_all(e, &progressed, inflight, &err);
  if (rc == WA_OK && e->closing) rc = close_ready(e, &ready, &err);
  if (rc != WA_OK) {
    wai_ulfm_on_error(e, &err);
    wai_engine_break(e, &err); /* wakes the application thread, which reports it */
    return WAI_POLL_IDLE;
  }
  if (ready) {
    wai_request_done(e, e->req);
    return WAI_POLL_FINISHED;
  }
  return progressed ? WAI_POLL_PROGRESSED : WAI_POLL_IDLE;
}

