/*
 * What http.c (the request flow) and http_start.c (the listeners' start
 * and stop) share: the server's private structures and limits, and the
 * libmicrohttpd callbacks the start registers. Serving layer only.
 */
#ifndef KGPU_EXT_HTTP_IMPL_H
#define KGPU_EXT_HTTP_IMPL_H

#include <microhttpd.h>

#include "serve.h"

/* Bodies above this, and the observers, are handled one at a time by the large-body thread. */
#define LARGE_BODY (1L << 20)
/* What working_estimate charges per JSON value, and per node of a reply (measured: see there). */
#define JSON_VALUE_BYTES 160
#define REPLY_NODE_BYTES 400
/* libmicrohttpd's buffer per connection: request line, headers, body pieces. */
#define CONN_MEMORY (16 * 1024)
/* The probe listener: kubelet's probes and a person with curl, no more. */
#define PROBE_CONNECTIONS   32
#define PROBE_PER_CLIENT    8
#define PROBE_TIMEOUT_S     5
#define PROBE_CONN_MEMORY   (8 * 1024)
/* Descriptors besides connections: listeners, epoll, pipes, API client, files. */
#define FD_SLACK 128

enum slot_phase { SLOT_READING, SLOT_WORKING, SLOT_SENDING };

/*
 * One per TCP connection of the scheduling listener, from libmicrohttpd's
 * connection notifications; in the registry the watchdog walks. The
 * descriptor stays valid while the slot is registered: libmicrohttpd
 * notifies the close before it closes the socket.
 */
#define PEER_DIGEST_LEN 32
/* A kept verdict is checked again after this long (a certificate may expire meanwhile). */
#define PEER_RECHECK_S 60.0

typedef struct conn_slot {
    struct conn_slot *prev, *next;
    int fd;
    double since;          /* monotonic start of the current phase */
    enum slot_phase phase; /* WORKING (a handler runs) has no deadline */
    bool shut;             /* the watchdog shut it down */
    /*
     * The client certificate's verdict, kept for the connection's next
     * requests (http.c client_allowed). Touched only by the connection's
     * I/O thread, which runs its requests one at a time.
     */
    bool peer_ok;
    double peer_checked;                        /* monotonic time of that verification */
    unsigned char peer_digest[PEER_DIGEST_LEN]; /* SHA-256 of the chain it was given for */
} conn_slot;

typedef struct request {
    struct ext_http *h;
    struct MHD_Connection *conn;
    conn_slot *slot;
    const char *method, *url; /* libmicrohttpd's, valid until the request completes */
    char *body;
    size_t len, cap;
    size_t charged; /* bytes charged to the buffer budget */
    ext_response resp;
    bool answered; /* resp holds the handler's answer (after a resume) */
    struct request *qnext;
} request;

typedef struct job_queue {
    request *head, *tail;
    pthread_cond_t cv;
} job_queue;

typedef struct worker {
    struct ext_http *h;
    job_queue *q; /* the one it serves */
    pthread_t thread;
} worker;

struct ext_http {
    const ext_config *cfg; /* the limits; borrowed, outlives the server */
    ext_metrics *metrics;  /* http_* counters */
    ext_http_handler handle;
    void *ctx;
    char *tls_cert_pem, *tls_key_pem, *tls_ca_pem; /* read once at start, owned */
    int port, probe_port;                          /* as bound */
    struct MHD_Daemon *main, *probe;
    bool pooled; /* epoll + handler pool; else one thread per connection, handlers inline */

    pthread_mutex_t mu; /* queues, stopping, the registry */
    job_queue small, large;
    bool stopping;
    worker *workers;
    int nworkers;

    conn_slot registry; /* sentinel of a circular list */
    pthread_cond_t watch_cv;
    pthread_t watchdog;
    bool watchdog_running;

    atomic_llong buffered; /* bytes charged by requests in flight */
};


/* libmicrohttpd's callbacks and the server's threads (http.c). */
void ext__http_on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                             enum MHD_ConnectionNotificationCode toe);
void *ext__http_watchdog_main(void *arg);
void *ext__http_worker_main(void *arg);
enum MHD_Result ext__http_on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                     const char *method, const char *version,
                                     const char *upload_data, size_t *upload_data_size,
                                     void **con_cls);
void ext__http_on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                            enum MHD_RequestTerminationCode toe);
enum MHD_Result ext__http_on_probe(void *cls, struct MHD_Connection *conn, const char *url,
                                   const char *method, const char *version,
                                   const char *upload_data, size_t *upload_data_size,
                                   void **con_cls);

#endif
