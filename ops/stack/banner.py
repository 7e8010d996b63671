"""What the run command prints once everything answers: where to click and what to paste."""

from __future__ import annotations

from ops.demo import DEMO_MODEL, DemoTopology
from ops.stack.credentials import Credentials


def banner(topology: DemoTopology, console_url: str, creds: Credentials, log_dir: str) -> str:
    us_east = next(b for b in topology.balancers if b.region == "us-east")
    base = f"http://{topology.host}:{us_east.port}/v1"
    balancers = "\n".join(
        f"    {b.region:<13} http://{topology.host}:{b.port}/v1" for b in topology.balancers
    )
    return f"""
Meridian is up.

  Console     {console_url}/
  Admin       {console_url}/admin/   user: {creds.admin_username}   password: {creds.admin_password}
  API key     {creds.api_key}
  Balancers (OpenAI-compatible):
{balancers}
  Logs        {log_dir}/

Stream a chat completion through us-east with the official openai package
(.venv/bin/python):

from openai import OpenAI
client = OpenAI(base_url="{base}", api_key="{creds.api_key}")
stream = client.chat.completions.create(
    model="{DEMO_MODEL}",
    messages=[{{"role": "user", "content": "Say hello from Meridian"}}],
    stream=True,
    stream_options={{"include_usage": True}},
)
for chunk in stream:
    if chunk.choices:
        print(chunk.choices[0].delta.content or "", end="", flush=True)
    elif chunk.usage:
        print("\\n", chunk.usage)

Or with curl:

curl -N {base}/chat/completions \\
  -H "Authorization: Bearer {creds.api_key}" -H "Content-Type: application/json" \\
  -d '{{"model": "{DEMO_MODEL}", "stream": true,
       "messages": [{{"role": "user", "content": "Hello"}}]}}'

Press Ctrl-C to stop every process.
"""
