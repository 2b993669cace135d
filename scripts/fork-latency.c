/* How long fork() takes in a program whose heap holds N objects of SIZE
 * bytes, one kept on each 4 KiB page and the rest freed (a sparse heap):
 * forks every 20 ms for MS milliseconds, each child leaving at once, and
 * prints the longest and mean time fork() took in the parent.
 *
 *   cc -O2 scripts/fork-latency.c -o /tmp/fork-latency
 *   PAGEWISE_MESH=1 PAGEWISE_BACKGROUND=0 LD_PRELOAD=target/release/libpagewise.so /tmp/fork-latency 2000000 64 3000
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <stdint.h>
#include <sys/wait.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t n=atol(argv[1]); int size=atoi(argv[2]); int ms=atoi(argv[3]);
  char**p=malloc(n*sizeof*p);
  for(size_t i=0;i<n;i++){p[i]=malloc(size);p[i][0]=1;}
  uintptr_t last=0;
  for(size_t i=0;i<n;i++){uintptr_t pg=(uintptr_t)p[i]>>12; if(pg!=last){last=pg;continue;} free(p[i]);p[i]=0;}
  double worst=0,total=0; int k=0; double end=now()+ms/1000.0;
  while(now()<end){
    double t0=now(); pid_t c=fork(); if(c==0)_exit(0); double d=now()-t0; waitpid(c,0,0);
    if(d>worst)worst=d;
    total+=d; k++; usleep(20000);
  }
  printf("forks %d worst %.1f ms mean %.1f ms\n",k,worst*1e3,total/k*1e3);
}
