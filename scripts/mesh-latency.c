/* How long a program that keeps allocating waits while the heap meshes:
 * allocates N objects of SIZE bytes, keeps the first object of each 4 KiB
 * page and frees the rest (a sparse heap a mesh pass will work on), then
 * for MS milliseconds allocates and frees bursts of 4,096 objects of the
 * same size, one a millisecond, and prints the longest and mean burst.
 * A burst takes new slab pages, so it needs its heap's page lists, which
 * a mesh pass holds while it copies.
 *
 *   cc -O2 scripts/mesh-latency.c -o /tmp/mesh-latency
 *   PAGEWISE_MESH=1 LD_PRELOAD=target/release/libpagewise.so /tmp/mesh-latency 2000000 64 4000
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <stdint.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t n=argc>1?atol(argv[1]):2000000; int size=argc>2?atoi(argv[2]):64; int quiet_ms=argc>3?atoi(argv[3]):3000;
  char**p=malloc(n*sizeof*p);
  for(size_t i=0;i<n;i++){p[i]=malloc(size);p[i][0]=1;}
  uintptr_t lastpage=0;
  for(size_t i=0;i<n;i++){uintptr_t pg=(uintptr_t)p[i]>>12; if(pg!=lastpage){lastpage=pg;continue;} free(p[i]);p[i]=0;}
  /* the rest of the program runs on: every ms, allocate a burst */
  double worst=0,total=0; long bursts=0; double end=now()+quiet_ms/1000.0;
  char**q=malloc(4096*sizeof*q);
  while(now()<end){
    double t0=now();
    for(int k=0;k<4096;k++){q[k]=malloc(size);q[k][0]=2;}
    for(int k=0;k<4096;k++)free(q[k]);
    double d=now()-t0; if(d>worst)worst=d; total+=d; bursts++;
    usleep(1000);
  }
  printf("bursts %ld worst %.3f ms mean %.3f ms\n",bursts,worst*1e3,total/bursts*1e3);
  return 0;
}
