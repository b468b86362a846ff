/*
 * The pod sandbox's process: what kubelet's runtime starts first in every
 * pod to hold its namespaces. Built statically by the node suite into the
 * sandbox image, since no registry is reachable to pull one. It waits for
 * a signal, reaps the zombies of processes that share its PID namespace,
 * and exits 0 on SIGINT or SIGTERM.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig)
{
    (void)sig;
    _exit(0);
}

static void on_child(int sig)
{
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
}

int main(void)
{
    struct sigaction stop = {.sa_handler = on_stop}, child = {.sa_handler = on_child};
    sigaction(SIGINT, &stop, NULL);
    sigaction(SIGTERM, &stop, NULL);
    sigaction(SIGCHLD, &child, NULL);
    for (;;)
        pause();
}
