/* The parameter-server strategy's wire protocol (docs/architecture.md, "Parameter server").
 *
 * Every connection opens with the communicator's authenticated handshake (net_hello.c, kind
 * NET_KIND_PS), then carries frames, each a 32-byte header and a payload:
 *
 *   magic "LDPS" u32 | version u16 | type u16 | request id u64 | status u32 | crc32c u32 |
 *   payload bytes u64                                                 (all little-endian)
 *
 * A request's status is 0; its reply has type PS_MSG_REPLY | request type, the request's id,
 * and a dist_status (not 0: the payload is the error message). The CRC-32C covers the
 * payload. A receiver checks magic, version and a cap on the payload before it allocates
 * anything: a frame that claims more than the cap ends the connection. */
#ifndef DIST_PS_WIRE_H
#define DIST_PS_WIRE_H

#include "dist/status.h"
#include "dist/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PS_MAGIC 0x5350444cu /* "LDPS" */
#define PS_WIRE_VERSION 1
#define PS_HEADER_BYTES 32
/* The largest payload either side accepts unless told otherwise: far above the model's
 * 0.5 MB gradients, far below what a hostile length field could make us allocate. */
#define PS_DEFAULT_FRAME_CAP ((uint64_t)256 << 20)
/* A frame's bytes must keep coming: a peer that stalls mid-frame this long is dropped. */
#define PS_FRAME_STALL_S 30.0

typedef enum ps_msg {
    PS_MSG_CREATE = 1, /* coordinator -> ps: variables (id, name, values) */
    PS_MSG_PULL,       /* worker/coordinator -> ps: ids -> values */
    PS_MSG_PUSH,       /* worker -> ps: an update rule and gradients of ids */
    PS_MSG_SAVE,       /* coordinator -> ps: ids -> values, slots, update counts */
    PS_MSG_RESTORE,    /* coordinator -> ps: what SAVE returned */
    PS_MSG_SHUTDOWN,   /* coordinator -> ps/worker: leave dist_strategy_serve */
    PS_MSG_EXEC,       /* coordinator -> worker: run a registered function */
    PS_MSG_DATASET,    /* coordinator -> worker: build a per-worker dataset */
    PS_MSG_STATS,      /* -> ps: updates applied so far */
    PS_MSG_COUNT,
    PS_MSG_REPLY = 0x100
} ps_msg;

typedef struct ps_header {
    uint16_t type;
    uint64_t id;
    uint32_t status;
    uint32_t crc;
    uint64_t length;
} ps_header;

const char *ps_msg_name(uint32_t type);

/* ---- building and reading payloads --------------------------------------------------------- */

/* A growing payload; any failed allocation sets `failed` and later puts do nothing. */
typedef struct ps_buf {
    unsigned char *p;
    size_t len, cap;
    bool failed;
} ps_buf;
void ps_buf_free(ps_buf *b);
void ps_buf_reset(ps_buf *b);
void ps_put_u32(ps_buf *b, uint32_t v);
void ps_put_u64(ps_buf *b, uint64_t v);
void ps_put_f32(ps_buf *b, float v);
void ps_put_bytes(ps_buf *b, const void *p, size_t n);
/* u32 length + bytes. */
void ps_put_str(ps_buf *b, const char *s);

/* Bounds-checked reads: past the end sets `failed` and returns zeros / NULL. */
typedef struct ps_reader {
    const unsigned char *p;
    size_t len, pos;
    bool failed;
} ps_reader;
uint32_t ps_get_u32(ps_reader *r);
uint64_t ps_get_u64(ps_reader *r);
float ps_get_f32(ps_reader *r);
const void *ps_get_bytes(ps_reader *r, size_t n);
/* A string into out (cap bytes with the NUL); longer than cap - 1 fails the reader. */
void ps_get_str(ps_reader *r, char *out, size_t cap);

/* ---- frames on a socket -------------------------------------------------------------------- */

/* One piece of a payload (sent from where it lies: gradients go from their buffer). */
typedef struct ps_piece {
    const void *p;
    size_t n;
} ps_piece;

dist_status ps_send_frame(int fd, uint32_t type, uint64_t id, uint32_t status,
                          const ps_piece *pieces, int count, double deadline, const char *who);
/* A reply whose status is not DIST_OK carries the thread's last error message. */
dist_status ps_send_error(int fd, uint32_t type, uint64_t id, dist_status status, double deadline,
                          const char *who);

/* The next header, waiting until `deadline` for its first byte; then checks it. Errors:
 * DIST_TIMEOUT (no frame by then), DIST_PEER_LOST (closed), DIST_FORMAT (bad magic,
 * version or type; a payload over `cap`), each naming `who`. */
dist_status ps_recv_header(int fd, ps_header *h, uint64_t cap, double deadline, const char *who);
/* A payload received in parts: each part lands where it belongs (values straight into the
 * model's buffer), the CRC accumulates, and ps_recv_check compares it at the end. */
typedef struct ps_rx {
    int fd;
    const ps_header *h;
    uint64_t left;
    uint32_t crc;
    const char *who;
} ps_rx;
void ps_rx_begin(ps_rx *rx, int fd, const ps_header *h, const char *who);
dist_status ps_rx_part(ps_rx *rx, void *dst, size_t n);
/* Reads and drops n bytes (CRC included). */
dist_status ps_rx_skip(ps_rx *rx, size_t n);
/* DIST_FORMAT when bytes are left over or the CRC differs. */
dist_status ps_rx_end(ps_rx *rx);
/* A whole payload into a malloc'd buffer (*out, free it), CRC checked. */
dist_status ps_recv_payload(int fd, const ps_header *h, unsigned char **out, const char *who);
/* A reply to request (type, id): DIST_OK, or the status and message it carries (the message
 * is the thread's error, prefixed with `who`). The payload, if any, is left to read with
 * ps_rx (*h filled). */
dist_status ps_recv_reply(int fd, uint32_t type, uint64_t id, ps_header *h, uint64_t cap,
                          double deadline, const char *who);

/* ---- tensors in payloads (closure arguments and results) ---------------------------------- */

/* u32 dtype | u32 ndim | u64 shape[ndim] | the plain host bytes. */
void ps_put_tensor(ps_buf *b, const dist_tensor *t);
/* A new host tensor (dist_tensor_destroy), checked against what is left of the reader:
 * DIST_FORMAT for a bad dtype, rank, or a shape whose bytes are not there. */
dist_status ps_get_tensor(ps_reader *r, dist_tensor **out);

#endif
