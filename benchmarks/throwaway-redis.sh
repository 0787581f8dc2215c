# Sourced by the shell benchmarks: `start_throwaway_redis DIR` starts a redis-server that
# keeps nothing on disk on a free port of 127.0.0.1, working in DIR, sets $port, and on exit
# stops it and removes DIR. Never the machine's own Redis.
start_throwaway_redis() {
  _dir=$1
  port=$(node -e "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})")
  redis-server --port "$port" --save '' --appendonly no --daemonize no --dir "$_dir" >/dev/null &
  _rpid=$!
  trap 'kill $_rpid 2>/dev/null; rm -rf "$_dir"' EXIT
  sleep 0.5
}
