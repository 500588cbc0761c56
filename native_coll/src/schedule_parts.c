/* The parts both schedules (schedule.c, schedule_hier.c) are built from: how a buffer is cut into
 * chunks, MPI_Testsome over one request set, and the ACT messages every member sends. They call
 * nothing of the schedules nor of coll.c: the schedules depend on this file, never the reverse. */
#include <stdlib.h>

#include "wa_internal.h"

void wai_chunk_of(size_t n, int S, int k, size_t *off, size_t *len) {
  size_t base = n / (size_t)S, rem = n % (size_t)S;
  *off = (size_t)k * base + ((size_t)k < rem ? (size_t)k : rem);
  *len = base + ((size_t)k < rem ? 1 : 0);
}

/* Testsome, not Testall: completed requests become MPI_REQUEST_NULL one by one, so which peers
 * have delivered is known without further MPI calls (wai_coll_missing, the exit report).
 * A request that completes in error is freed like one that succeeded, so its peer would look
 * delivered: the failed request's peer is named instead, from the statuses, or where MPI returns
 * the error without them (MPICH's single-copy receive from a sender killed during the transfer)
 * as the one request that the failed call closed. */
int wai_coll_test_set(wa_coll *c, int set, int *all_done, wai_err *err) {
  MPI_Request *rq = wai_rq_set(c, set);
  int outcount = 0;
  for (int j = 0; j < c->S; j++) c->pend[j] = rq[j] != MPI_REQUEST_NULL;
  int rc = MPI_Testsome(c->S, rq, &outcount, c->indices, c->statuses);
  if (rc != MPI_SUCCESS) {
    int peer = -1; /* -1: MPI does not say which request failed */
    if (rc == MPI_ERR_IN_STATUS) {
      for (int i = 0; i < outcount; i++)
        if (c->statuses[i].MPI_ERROR != MPI_SUCCESS) {
          peer = c->members[c->indices[i]];
          rc = c->statuses[i].MPI_ERROR;
          break;
        }
    } else {
      int closed = 0, last = -1;
      for (int j = 0; j < c->S; j++)
        if (c->pend[j] && rq[j] == MPI_REQUEST_NULL) closed++, last = j;
      if (closed == 1) peer = c->members[last];
    }
    char s[MPI_MAX_ERROR_STRING] = "";
    int l = 0;
    (void)MPI_Error_string(rc, s, &l); /* on failure s stays empty */
    return wai_err_set(err, WA_EMPI, peer, "MPI_Testsome failed: %s", s);
  }
  *all_done = 1;
  for (int j = 0; j < c->S; j++)
    if (rq[j] != MPI_REQUEST_NULL) {
      *all_done = 0;
      break;
    }
  return WA_OK;
}

int wai_coll_send_acts(const wai_wire *w, wa_coll *c, wai_err *err) {
  for (int j = 0; j < c->S; j++) {
    if (j == c->me) continue;
    WAI_CHECK_MPI(err, c->members[j],
                  MPI_Isend(&c->act_msg, WAI_MSG_WORDS, MPI_INT64_T, c->members[j], WAI_TAG_CTRL,
                            w->comm, &wai_rq_set(c, RQ_ACT_SEND)[j]));
  }
  return WA_OK;
}
