/* Failure: the one place the engine becomes unusable (wai_engine_break) and the messages that say
 * why, naming the ranks that did not answer (e->failed, wa_failed_ranks) so a user learns which
 * process, node or link was lost. */
#include <string.h>

#include "engine.h"

/* The one place the engine becomes unusable. The first failure is kept (later ones are its
 * consequences) and the application thread waiting in a call is woken to report it. */
void wai_engine_break(wa_engine *e, const wai_err *err) {
  if (e->broken) return;
  snprintf(e->err, sizeof e->err, "%s", err->msg);
  e->broken = err->code;
  e->failed_peer = err->peer;
  pthread_cond_broadcast(&e->done);
}

void wai_coll_name(const wa_engine *e, int64_t t, char *s, size_t cap) {
  if (t < 0)
    snprintf(s, cap, "synchronize");
  else
    snprintf(s, cap, "%s iteration %lld", wai_is_global(e, t) ? "global" : "group", (long long)t);
}

static void ranks_list(char *s, size_t cap, const int *ranks, int n) {
  size_t used = 0;
  s[0] = '\0';
  for (int i = 0; i < n && used + 16 < cap; i++)
    used += (size_t)snprintf(s + used, cap - used, i ? ", %d" : "%d", ranks[i]);
}

/* An error in flight broke the engine (mu held): name the members that had not delivered, like
 * a timeout does, for the call that learns it (``what``: the collective it names). The peer whose
 * send or receive failed is the one lost; when MPI does not say (a failed test), every member of
 * ``c`` (the call's collective) that had not delivered is suspect. Returns WA_EPEER when it named
 * someone, else WA_EBROKEN. */
static int name_mpi_failure(wa_engine *e, wa_coll *c, const char *what) {
  e->mpi_named = 1;
  if (e->failed_peer >= 0) {
    e->failed[0] = e->failed_peer;
    e->n_failed = 1;
  } else {
    e->n_failed = c ? wai_coll_missing(c, e->failed) : 0;
    /* MPI's progress is global: the test that failed may have been another collective's (a
     * single-copy receive from a killed sender fails in whichever call drives progress, and
     * its request can look complete). Then its members that had not delivered are suspect. */
    wa_coll *f = e->broken == WA_EMPI ? wai_engine_find(e->active, e->failed_t) : NULL;
    if (e->n_failed == 0 && f) {
      e->n_failed = wai_coll_missing(f, e->failed);
      if (e->n_failed == 0) /* every member delivered, as far as the requests say */
        for (int j = 0; j < f->S; j++)
          if (j != f->me) e->failed[e->n_failed++] = f->members[j];
    }
  }
  if (e->n_failed == 0) return WA_EBROKEN;
  char who[256], cause[sizeof e->err];
  ranks_list(who, sizeof who, e->failed, e->n_failed);
  snprintf(cause, sizeof cause, "%s", e->err);
  char *cut = strstr(cause, ", error stack");
  if (!cut) cut = strchr(cause, '\n');
  if (cut) *cut = '\0'; /* MPICH's error stack follows */
  snprintf(e->err, sizeof e->err, "%s failed: the connection to rank(s) [%s] broke (%s); the "
           "collective is now unusable (close it)", what, who, cause);
  return WA_EPEER;
}

/* A call that finds the engine broken (mu held): the failure ULFM named; an MPI error that broke
 * it between calls (the progress thread's, while the application was elsewhere), named now for
 * this first call to learn it, as for a call that was waiting; else, or once named, unusable. */
int wai_name_break(wa_engine *e) {
  if (e->lost_known) return WA_EPEER;
  if (e->broken != WA_EMPI || e->mpi_named) return WA_EBROKEN;
  wa_coll *f = wai_engine_find(e->active, e->failed_t);
  char what[64];
  wai_coll_name(e, f ? f->t : e->next_t, what, sizeof what);
  return name_mpi_failure(e, NULL, what);
}

/* A request that did not finish (mu held): the engine broke while it waited, or its deadline
 * passed (then the engine breaks here with WA_ETIMEOUT). */
int wai_name_request_failure(wa_engine *e, wa_req *r) {
  int rc;
  /* The collective the call was waiting on: the outstanding overlapped global when the request
   * could not be taken yet (wa.h's bound), else this call's own collective. */
  wa_coll *c = !r->taken && e->outstanding ? e->outstanding : wai_engine_find(e->active, r->t);
  char what[64];
  wai_coll_name(e, c ? c->t : r->t, what, sizeof what);
  if (c && c != e->outstanding) c->app = NULL; /* never deliver into this call's stack frame */
  if (e->lost_known) { /* ulfm.c named the dead ranks in e->failed and e->err */
    if (e->lost_known == 1) {
      if (e->n_failed == 0 && c) e->n_failed = wai_coll_missing(c, e->failed);
      char cause[sizeof e->err];
      snprintf(cause, sizeof cause, "%s", e->err);
      snprintf(e->err, sizeof e->err, "%s failed: %s", what, cause);
      e->lost_known = 2; /* the call it broke is named once; later calls repeat the message */
    }
    return WA_EPEER;
  }
  if (e->broken && e->broken != WA_ETIMEOUT) {
    rc = name_mpi_failure(e, e->broken == WA_EMPI ? c : NULL, what);
  } else {
    e->n_failed = c ? wai_coll_missing(c, e->failed) : 0;
    char who[256];
    ranks_list(who, sizeof who, e->failed, e->n_failed);
    wai_err err;
    if (e->n_failed > 0)
      wai_err_set(&err, WA_ETIMEOUT, -1, "%s did not complete within %g s: rank(s) [%s] did "
                  "not answer; the collective is now unusable (close it)", what, e->timeout, who);
    else /* every message arrived and every send completed: MPI itself made no progress */
      wai_err_set(&err, WA_ETIMEOUT, -1, "%s did not complete within %g s although every "
                  "member answered (the MPI library stopped progressing); the collective is now "
                  "unusable (close it)", what, e->timeout);
    wai_engine_break(e, &err);
    rc = WA_ETIMEOUT;
  }
  return rc;
}

/* A close whose deadline passed (mu held): the ranks that did not announce their close. */
int wai_name_close_failure(wa_engine *e) {
  e->n_failed = 0;
  for (int j = 0; j < e->P; j++)
    if (j != e->wire.rank && !e->fin_from[j]) e->failed[e->n_failed++] = j;
  char who[256];
  ranks_list(who, sizeof who, e->failed, e->n_failed);
  wai_err err;
  wai_err_set(&err, WA_ETIMEOUT, -1, "close() did not complete within %g s: rank(s) [%s] did "
              "not call close()", e->timeout, who);
  wai_engine_break(e, &err); /* a failure during the close, if any, stays the cause */
  return e->broken == WA_ETIMEOUT ? WA_ETIMEOUT : WA_EBROKEN;
}
