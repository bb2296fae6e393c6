#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <immintrin.h>
#define ARCH_GET_XCOMP_SUPP 0x1021
#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
int main(){
  uint64_t m=0; long r=syscall(SYS_arch_prctl, ARCH_GET_XCOMP_SUPP, &m);
  printf("supp r=%ld mask=%llx\n", r, (unsigned long long)m);
  r=syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, 18); printf("req r=%ld\n", r);
  m=0; r=syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &m); printf("perm r=%ld mask=%llx\n", r,(unsigned long long)m);
  unsigned int eax,ebx,ecx,edx; __asm__("xgetbv":"=a"(eax),"=d"(edx):"c"(0)); printf("xcr0=%x:%x\n",edx,eax);
  __asm__ volatile("cpuid":"=a"(eax),"=b"(ebx),"=c"(ecx),"=d"(edx):"a"(0xd),"c"(0)); printf("cpuid d.0 eax=%x\n",eax);
  __asm__ volatile("cpuid":"=a"(eax),"=b"(ebx),"=c"(ecx),"=d"(edx):"a"(0x1d),"c"(1)); printf("cpuid 1d.1 eax=%x ebx=%x ecx=%x\n",eax,ebx,ecx);
  struct { uint8_t palette, start; uint8_t res[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((packed)) cfg;
  memset(&cfg,0,sizeof cfg); cfg.palette=1; for(int i=0;i<8;i++){cfg.colsb[i]=64;cfg.rows[i]=16;}
  _tile_loadconfig(&cfg); printf("ldtilecfg ok\n"); fflush(stdout);
  _tile_zero(0); printf("tilezero ok\n"); fflush(stdout);
  static int8_t a[16*64], b[16*64]; static int32_t c[16*16];
  for(int i=0;i<1024;i++){a[i]=1;b[i]=2;}
  _tile_loadd(1,a,64); _tile_loadd(2,b,64); printf("loadd ok\n"); fflush(stdout);
  _tile_dpbssd(0,1,2); printf("dpbssd ok\n"); fflush(stdout);
  _tile_stored(0,c,64); printf("c0=%d\n",c[0]);
  _tile_release(); return 0;
}
